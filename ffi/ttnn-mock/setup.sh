#!/usr/bin/env bash
# The mock-device kit: the real ttnn 0.81.1 (PyPI wheel) on tt-metal's mock cluster, for the ttnn
# shim's tests (no hardware). Makes, under DIR:
#   venv/    CPython 3.12 (else 3.10) with ttnn==0.81.1 and pybind11 (the shim's build needs it)
#   rt/      the runtime root: the installed ttnn package as it is, with
#            runtime/sfpi/compiler/bin/riscv-tt-elf-g++, the stand-in compiler built with g++
#            from stand_in_compiler.cpp beside this file
#   cache/   a private TT_METAL_CACHE (placeholder kernels carry the real cache key: never let
#            them into ~/.cache/tt-metal-cache, where a real chip would later load them)
#   lib/     libclef_tt_trace_shim.so, built with g++ from trace_shim.cpp beside this file: makes
#            ttnn's trace capture and replay work in mock mode, and refuses inside a capture what
#            chips refuse (host writes, reads, event records, finishes, program-cache misses)
#   env.sh   the environment: source it, then `cargo build` builds libclef_tt_ttnn.so and
#            `clef-tt devices --device tt` opens the mock P150x2 (hardware: mock); it puts the
#            trace shim first in LD_PRELOAD (every process of the shell loads it; it does nothing
#            until libtt_metal.so calls it). test_trace_kit.py beside this file checks traces.
# usage: ffi/ttnn-mock/setup.sh [--golden] DIR && source DIR/env.sh
#   --golden also installs torch (pinned; ~4 GB with the CUDA packages it needs to import, ~1 min
#   from PyPI) for the golden-shadow mode (CLEF_TT_GOLDEN=1, tests/tt_golden.rs): ttnn's golden
#   functions are torch code.
# The cluster descriptors: blackhole_2xP150.yaml (two P150 chips, both on PCIe, four ethernet
# links between them, the harvest masks P150 boards report) is the default; clef_tt_mock_chips 1
# (a function env.sh defines) switches to blackhole_P150.yaml (one chip), 2 back.
# TT_MOCK_GXX=stub makes the stand-in write placeholder kernels so ops dispatch; fail makes every
# kernel compile fail (op validation, which comes first, still runs).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
golden=0
if [ "${1:-}" = --golden ]; then golden=1; shift; fi
[ $# -eq 1 ] || { echo "usage: $0 [--golden] DIR" >&2; exit 2; }
dir="$(mkdir -p "$1" && cd "$1" && pwd)"
py="${TT_MOCK_PYTHON:-}"
if [ -z "$py" ]; then
  pyenv_root="${PYENV_ROOT:-$HOME/.pyenv}"
  for c in python3.12 "$pyenv_root"/versions/3.12*/bin/python3.12 python3.10 "$pyenv_root"/versions/3.10*/bin/python3.10; do
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys' 2>/dev/null; then py="$(command -v "$c")"; break; fi
  done
fi
[ -n "$py" ] || { echo "ttnn 0.81.1 has wheels for CPython 3.12 and 3.10 only; none found (set TT_MOCK_PYTHON)" >&2; exit 1; }
command -v g++ >/dev/null 2>&1 || { echo "the stand-in compiler and the trace shim need g++ (apt-get install g++)" >&2; exit 1; }
[ -x "$dir/venv/bin/python" ] || "$py" -m venv "$dir/venv"
"$dir/venv/bin/python" -c 'import ttnn, pybind11' 2>/dev/null ||
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check "ttnn==0.81.1" "pybind11==3.*"
# The torch the golden-shadow numbers in the README were measured with.
if [ "$golden" = 1 ] && ! "$dir/venv/bin/python" -c 'import torch' 2>/dev/null; then
  "$dir/venv/bin/pip" install --quiet --disable-pip-version-check "torch==2.15.0"
fi
pkg="$("$dir/venv/bin/python" -c 'import importlib.util as u; print(u.find_spec("ttnn").submodule_search_locations[0])')"
rt="$dir/rt"
rm -rf "$rt"
mkdir -p "$rt/runtime/sfpi/compiler/bin" "$dir/cache"
for f in "$pkg"/*; do
  [ "$(basename "$f")" = runtime ] || ln -s "$f" "$rt/$(basename "$f")"
done
# runtime/: the package's (hw/: linker scripts, firmware sources) plus the stand-in sfpi.
for f in "$pkg"/runtime/*; do
  [ "$(basename "$f")" = sfpi ] || ln -s "$f" "$rt/runtime/$(basename "$f")"
done
# The stand-in compiler (stand_in_compiler.cpp says what it writes), built with g++ under a
# temporary name, then renamed.
gxx="$rt/runtime/sfpi/compiler/bin/riscv-tt-elf-g++"
g++ -std=c++17 -O2 -Wall -Wextra -o "$gxx.tmp" "$here/stand_in_compiler.cpp"
mv -f "$gxx.tmp" "$gxx"
# The trace shim (trace_shim.cpp says what it interposes and why). Built under a temporary name,
# then renamed: processes that have the old one loaded keep it intact. The version script keeps
# the C++ library's template instances out of the exported symbols.
mkdir -p "$dir/lib"
shim="$dir/lib/libclef_tt_trace_shim.so"
printf '{ global: _ZN2tt8tt_metal*; _ZNK2tt8tt_metal*; local: *; };\n' >"$dir/lib/trace_shim.map"
g++ -std=c++17 -O2 -fPIC -shared -Wall -Wextra -o "$shim.tmp" "$here/trace_shim.cpp" \
  -Wl,--version-script="$dir/lib/trace_shim.map" -ldl
mv -f "$shim.tmp" "$shim"
cat >"$dir/env.sh" <<ENV
# The mock-device kit's environment (ffi/ttnn-mock/setup.sh).
export TT_METAL_RUNTIME_ROOT=$rt
export TT_METAL_MOCK_CLUSTER_DESC_PATH=$here/blackhole_2xP150.yaml
export TT_METAL_CACHE=$dir/cache/
export TT_MOCK_GXX=\${TT_MOCK_GXX:-stub}
export CLEF_TT_PYTHON=$dir/venv/bin/python
# The trace shim, first in LD_PRELOAD (once, however often this file is sourced).
case ":\${LD_PRELOAD:-}:" in
  *":$shim:"*) ;;
  *) export LD_PRELOAD="$shim\${LD_PRELOAD:+:\$LD_PRELOAD}" ;;
esac
# One chip (P150) or two (P150x2).
clef_tt_mock_chips() {
  case "\$1" in
    1) export TT_METAL_MOCK_CLUSTER_DESC_PATH=$here/blackhole_P150.yaml ;;
    2) export TT_METAL_MOCK_CLUSTER_DESC_PATH=$here/blackhole_2xP150.yaml ;;
    *) echo "clef_tt_mock_chips 1|2" >&2; return 2 ;;
  esac
}
ENV
echo "mock kit ready in $dir: source $dir/env.sh"
