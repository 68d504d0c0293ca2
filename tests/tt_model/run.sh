#!/usr/bin/env bash
# The clef-tt wheel as tt-model's image would hold it, tested on the CPU: built from this
# checkout's cargo build of PROFILE (packaging/build-wheel.sh; nothing is rebuilt when the build
# is current), then — with the checkout hidden, as if deleted (a private mount namespace puts
# an empty tmpfs over it) — installed into a fresh venv with uvicorn only, tt-model's verify
# lines run as its verify.sh runs them, and the launcher started as tt-model starts it
# (tests/clients/launcher_test.py). Needs root (unshare), python3 with venv, and PyPI for
# maturin and uvicorn.
#
# CLEF_SDK_PYTHON, when set, is a Python with requests, httpx and typesafe-sdk: the launcher's
# refusals are then read with every client (tests/clients/oversize_bodies.py), else with urllib.
#
# usage: tests/tt_model/run.sh [dev|release]
set -euo pipefail
cd "$(dirname "$0")/../.."
profile="${1:-dev}"
repo="$PWD"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

tools="$scratch/tools"
python3 -m venv "$tools"
"$tools/bin/pip" install --quiet "maturin>=1.9,<2" "pyyaml==6.0.*"
"$tools/bin/python" tests/tt_model/check_package.py .
MATURIN="$tools/bin/maturin" packaging/build-wheel.sh --profile "$profile" --out "$scratch/wheel"
wheel="$(ls "$scratch"/wheel/*.whl)"
"$tools/bin/python" tests/tt_model/check_package.py . "$wheel"

# What the image has besides the wheel: code/ (the launcher), the published manifest (for its
# verify lines and profile), and the weights (here the tiny fixture, as HF_MODEL).
mkdir -p "$scratch/code" "$scratch/tests"
cp -r launcher "$scratch/code/"
find "$scratch/code" -name __pycache__ -prune -exec rm -rf {} +
cp tt_kernel_manifest.json "$scratch/"
cp tests/clients/launcher_test.py tests/clients/oversize_bodies.py "$scratch/tests/"
cp -r tests/fixtures/tiny-clef "$scratch/model"

unshare --mount --propagation private bash -s "$repo" "$scratch" <<'INNER'
set -euo pipefail
repo="$1"; scratch="$2"
mount -t tmpfs -o size=1m,mode=0555 none "$repo"
test -z "$(ls -A "$repo")" || { echo "the checkout is still visible"; exit 1; }
cd "$scratch"
# The image's Python: the one the shim embeds when the build made one (CLEF_TT_PYTHON, with
# ttnn 0.81.1: the PyPI wheel stands in for the image's source build of tt-metal v0.81.1),
# else the system's.
if [ -n "${CLEF_TT_PYTHON:-}" ]; then
  "$CLEF_TT_PYTHON" -m venv venv
  venv/bin/pip install --quiet wheel/*.whl "uvicorn>=0.30" "ttnn==0.81.1"
else
  python3 -m venv venv
  venv/bin/pip install --quiet wheel/*.whl "uvicorn>=0.30"
fi
echo "venv: $(venv/bin/pip list --format=freeze 2>/dev/null | grep -v -e '^pip=' -e '^setuptools=' | tr '\n' ' ')"
# tt-model's verify.sh: each verify line as `"$VENV/bin/python" -c '<line>'`, code/ on
# PYTHONPATH, the venv first on PATH, from a work dir. The ttnn-shim line passes only when the
# wheel carries the shim; otherwise it must fail and say so.
python3 - "$scratch" <<'PY'
import json, os, subprocess, sys
scratch = sys.argv[1]
verify = json.load(open(os.path.join(scratch, "tt_kernel_manifest.json")))["container"]["verify"]
env = dict(os.environ, PYTHONPATH=os.path.join(scratch, "code"),
           PATH=os.path.join(scratch, "venv", "bin") + os.pathsep + os.environ["PATH"])
# An image build sees no chips (and no mock cluster), and the image sets none of the shim's
# variables: the launcher finds the shim and the Python itself.
for var in ("TT_METAL_MOCK_CLUSTER_DESC_PATH", "CLEF_TT_PYTHON", "CLEF_TT_SHIM"):
    env.pop(var, None)
work = os.path.join(scratch, "work"); os.makedirs(work, exist_ok=True)
shipped = any(os.path.isdir(os.path.join(d, "clef_tt_shim")) for d in
              [os.path.join(scratch, "venv", "lib", v, "site-packages") for v in os.listdir(os.path.join(scratch, "venv", "lib"))])
for line in verify:
    r = subprocess.run([os.path.join(scratch, "venv", "bin", "python"), "-c", line], env=env, cwd=work,
                       capture_output=True, text=True)
    if ("ttnn_shim()" in line or "check_shim()" in line) and not shipped:
        assert r.returncode != 0 and ("no ttnn shim" in r.stderr
                                      or "no Tenstorrent shim" in r.stderr), r.stderr
        print(f"verify: fails as it must without a ttnn shim: {line[:60]}...")
        continue
    assert r.returncode == 0, f"verify line failed: {line}\n{r.stdout}{r.stderr}"
    print(f"verify: ok: {line[:70]}")
if shipped:
    # The shim check refuses an environment of another CPython than the shim embeds, naming both
    # (the image of a mismatched wheel fails its build, not its first device start).
    other = os.path.join(scratch, "venv-other")
    subprocess.run(["python3", "-m", "venv", other], check=True)
    embeds = subprocess.run([os.path.join(scratch, "venv", "bin", "python"), "-c",
                             "import sys; print('%d.%d' % sys.version_info[:2])"],
                            capture_output=True, text=True, check=True).stdout.strip()
    found = subprocess.run([os.path.join(other, "bin", "python"), "-c",
                            "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if found != embeds:
        subprocess.run([os.path.join(other, "bin", "pip"), "install", "--quiet",
                        *__import__("glob").glob(os.path.join(scratch, "wheel", "*.whl"))], check=True)
        r = subprocess.run([os.path.join(other, "bin", "python"), "-c",
                            "import launcher.clef_tt_asgi as l; l.check_shim()"],
                           env=dict(env, PATH=os.path.join(other, "bin") + os.pathsep + os.environ["PATH"]),
                           cwd=work, capture_output=True, text=True)
        assert r.returncode != 0 and f"is CPython {found}, this shim embeds CPython {embeds}" in r.stderr, r.stderr
        print(f"verify: the shim check refuses a CPython {found} image (the shim embeds {embeds})")
    else:
        print(f"verify: no second CPython to refuse (python3 is {found}, as the shim's)")
    # The installed shim loads as the launcher points clef-tt at it: located, dlopen'd (libpython
    # found), its ABI accepted and its op package found beside it. Without ttnn here the
    # embedded Python then stops at the first ttnn/numpy import, which is past all of that.
    launch_env = subprocess.run(
        [os.path.join(scratch, "venv", "bin", "python"), "-c",
         "import json, launcher.clef_tt_asgi as l; print(json.dumps(l.clef_tt_env('127.0.0.1', 0)))"],
        env=env, cwd=work, capture_output=True, text=True, check=True).stdout
    env = json.loads(launch_env)
    r = subprocess.run([os.path.join(scratch, "venv", "bin", "clef-tt"), "devices", "--device", "tt"],
                       env=dict(env, RUST_BACKTRACE="0"), cwd=work, capture_output=True, text=True)
    for refusal in ("no Tenstorrent shim found", "cannot load the Tenstorrent shim", "is not a clef-tt shim",
                    "implements clef-tt shim ABI", "is not beside the shim"):
        assert refusal not in r.stderr, r.stderr
    print(f"ttnn shim: loads from {env['CLEF_TT_SHIM']} (devices: exit {r.returncode})")
PY
python3 tests/launcher_test.py --python "$scratch/venv/bin/python" --code "$scratch/code" \
  --manifest "$scratch/tt_kernel_manifest.json" --model "$scratch/model" --work "$scratch/work" \
  ${CLEF_SDK_PYTHON:+--clients-python "$CLEF_SDK_PYTHON"}
INNER
