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
#   --require-ttnn  fail when the build made no ttnn shim (for a wheel that serves --device tt)
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
output="$(ls -t target/"$dir"/build/tt-metal-sys-*/output 2>/dev/null | head -n 1 || true)"
shim=""
[ -n "$output" ] && shim="$(sed -n 's/^cargo:rustc-env=CLEF_TT_TTNN_SHIM=//p' "$output")"
stage=target/wheel-data
rm -rf "$stage"
mkdir -p "$stage"
if [ -n "$shim" ] && [ -f "$shim" ] && [ -f "$(dirname "$shim")/clef_tt_ttnn/__init__.py" ]; then
  mkdir -p "$stage/platlib/clef_tt_shim/clef_tt_ttnn"
  cp "$shim" "$stage/platlib/clef_tt_shim/"
  cp "$(dirname "$shim")"/clef_tt_ttnn/*.py "$stage/platlib/clef_tt_shim/clef_tt_ttnn/"
  echo "ttnn shim: included ($shim)"
else
  echo "ttnn shim: NOT included (this $profile build made none; build with CLEF_TT_PYTHON naming a CPython 3.12/3.10 with pybind11, see ffi/BRINGUP.md)"
  [ "$require_ttnn" = 1 ] && exit 1
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
(cd packaging && "$maturin" build --profile "$profile" --out "$out")
