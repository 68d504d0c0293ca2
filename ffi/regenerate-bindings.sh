#!/usr/bin/env bash
# Regenerates src/bindings.rs from include/clef_tt.h with bindgen-cli 0.72.1 (needs libclang:
# Debian's libclang-dev). The output is committed; CI runs this into a temporary file and fails
# on any difference (`.ci/run`). Usage: ffi/regenerate-bindings.sh [OUT]  (default src/bindings.rs)
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
