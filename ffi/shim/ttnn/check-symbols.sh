#!/usr/bin/env bash
# Checks that every function the ttnn backend calls (symbols.txt) exists, with those leading
# parameter types, in the ttnn 0.81.1 wheel's libraries (the release the shim targets). Needs
# only pip, unzip and nm; no device and no tt-metal build. Usage: check-symbols.sh [WHEEL]
# (default: pip download ttnn==0.81.1 into a temporary directory).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
wheel="${1:-}"
if [ -z "$wheel" ]; then
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_34_x86_64 ttnn==0.81.1 -d "$work"
  wheel="$(ls "$work"/ttnn-0.81.1-*.whl)"
fi
unzip -q -o "$wheel" 'ttnn/build/lib/_ttnncpp.so' 'ttnn/build/lib/libtt_metal.so' -d "$work/w"
for lib in "$work"/w/ttnn/build/lib/*.so; do nm -DC --defined-only "$lib"; done | cut -c20- > "$work/symbols"
missing=0
checked=0
while IFS= read -r line; do
  case "$line" in ''|'#'*) continue ;; esac
  checked=$((checked + 1))
  if ! grep -qF -- "$line" "$work/symbols"; then
    echo "not in ttnn 0.81.1: $line"
    missing=$((missing + 1))
  fi
done < "$here/symbols.txt"
echo "ttnn backend: $checked functions checked against $(basename "$wheel"), $missing missing"
[ "$missing" -eq 0 ]
