#!/usr/bin/env bash
# Regenerates src/bindings.rs from include/clef_tt.h with bindgen-cli 0.72.1 (needs libclang:
# Debian's libclang-dev), and the op package's shim/ttnn/clef_tt_ttnn/abi.py (the header's enums
# as Python integers, abi_enums.py), so the header is the one source of the enums for C++, Rust
# and Python. Both outputs are committed; CI runs this into a temporary folder and fails on any
# difference (`.ci/run`). Usage: ffi/regenerate-bindings.sh [OUT [ABI_PY]]
# (default src/bindings.rs and shim/ttnn/clef_tt_ttnn/abi.py)
set -euo pipefail
cd "$(dirname "$0")"
out="${1:-src/bindings.rs}"
bindgen include/clef_tt.h \
  --dynamic-loading ClefTtLibrary \
  --dynamic-link-require-all \
  --allowlist-function 'clef_tt_.*' \
  --allowlist-type 'clef_tt_.*' \
  --allowlist-var 'CLEF_TT_.*' \
  --no-prepend-enum-name \
  --no-doc-comments \
  -o "$out"
python3 abi_enums.py include/clef_tt.h "${2:-shim/ttnn/clef_tt_ttnn/abi.py}"
