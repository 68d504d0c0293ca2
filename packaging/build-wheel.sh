#!/usr/bin/env bash
# Builds the clef-tt wheel (packaging/pyproject.toml, maturin with bindings = "bin") from the
# cargo build of one profile: target/<profile>/clef-tt, and the ttnn shim that build made
# (libclef_tt_ttnn.so and clef_tt_ttnn/, built where CLEF_TT_PYTHON names a CPython 3.12/3.10
# with pybind11) into site-packages/clef_tt_shim/. The host shim is not shipped: an installed
# clef-tt either drives ttnn or says that no shim is there.
#
# usage: packaging/build-wheel.sh [--profile release|dev] [--out DIR] [--require-ttnn]
#   --profile       cargo profile to package (default release; CI packages its dev build)
#   --out           where the wheel goes (default target/wheels)
#   --require-ttnn  fail when the build made no ttnn shim, or one embedding another CPython than
#                   tt-model.yaml's image runs (for the wheel that serves --device tt there)
# maturin: $MATURIN, else `maturin` on PATH (pip install "maturin>=1.9,<2").
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
out=target/wheels
require_ttnn=0
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --require-ttnn) require_ttnn=1; shift ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
case "$profile" in
  dev) dir=debug ;;
  *) dir="$profile" ;;
esac
maturin="${MATURIN:-maturin}"
command -v "$maturin" >/dev/null || { echo "maturin is required: pip install 'maturin>=1.9,<2'" >&2; exit 1; }

# The build (nothing to do when it is current); the shims come out of ffi/build.rs with it.
cargo build --profile "$profile" --bin clef-tt

# The ttnn shim this build made: ffi/build.rs records it (empty when it made none), so a stale
# library left in target/ by an earlier build is never shipped.
output="$(ls -t target/"$dir"/build/clef-tt-abi-*/output 2>/dev/null | head -n 1 || true)"
shim=""
[ -n "$output" ] && shim="$(sed -n 's/^cargo:rustc-env=CLEF_TT_TTNN_SHIM=//p' "$output")"
stage=target/wheel-data
rm -rf "$stage"
mkdir -p "$stage"
if [ -n "$shim" ] && [ -f "$shim" ] && [ -f "$(dirname "$shim")/clef_tt_ttnn/__init__.py" ]; then
  # The CPython the shim embeds (its libpython, read from the ELF's dynamic section). A wheel
  # for tt-model's image (--require-ttnn) must embed the Python the image runs (tt-model.yaml's
  # source.python): the embedded interpreter refuses any other, but only at the first device
  # start, hours after the image built.
  embeds="$(readelf -d "$shim" | sed -n 's/.*Shared library: \[libpython\([0-9]*\.[0-9]*\)\.so.*/\1/p' | head -n 1)"
  image_python="$(sed -n 's/^  python: "\([0-9.]*\)".*/\1/p' tt-model.yaml)"
  if [ "$require_ttnn" = 1 ] && [ "$embeds" != "$image_python" ]; then
    echo "the ttnn shim embeds CPython ${embeds:-?} but tt-model.yaml's image runs CPython $image_python:" \
      "rebuild with CLEF_TT_PYTHON naming a CPython $image_python with pybind11" >&2
    exit 1
  fi
  mkdir -p "$stage/platlib/clef_tt_shim"
  cp "$shim" "$stage/platlib/clef_tt_shim/"
  # The whole op package, its subpackages too (golden/ is imported at start).
  cp -r "$(dirname "$shim")/clef_tt_ttnn" "$stage/platlib/clef_tt_shim/"
  find "$stage/platlib/clef_tt_shim" -name __pycache__ -prune -exec rm -rf {} +
  echo "ttnn shim: included ($shim, embeds CPython ${embeds:-?})"
else
  echo "ttnn shim: NOT included (this $profile build made none; build with CLEF_TT_PYTHON naming a CPython 3.12/3.10 with pybind11, see ffi/BRINGUP.md)"
  [ "$require_ttnn" = 1 ] && exit 1
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
(cd packaging && "$maturin" build --profile "$profile" --out "$out")
