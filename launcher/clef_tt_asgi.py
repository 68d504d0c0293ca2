"""The ASGI app tt-model's `tt-dit-server` kind runs for clef-tt: it hands uvicorn's port to
clef-tt instead of relaying to it.

tt-model starts `python -m uvicorn --host 0.0.0.0 --port P --lifespan on
launcher.clef_tt_asgi:app` and reads "Application startup complete" in the container log as
the sign that the server is ready. uvicorn runs the lifespan startup before it binds its
socket, so at that moment this app replaces the process (execve, same pid) with
`clef-tt serve` on uvicorn's host and port. Then:

- every response is clef-tt's own (status, headers, body: 413, 422, 429 with Retry-After, 503
  while warming), bodies stream through nothing, clef-tt's queue and its own concurrency are
  the only limits, and /health costs what it costs directly;
- there is no second process: SIGTERM from `docker stop` reaches clef-tt itself (it drains
  for at most CLEF_SHUTDOWN_TIMEOUT, 90 s, inside tt-model's 120 s), SIGKILL leaves nothing
  behind, and a port that is taken fails the start;
- the ready line comes from clef-tt, once it listens and every worker has warmed up
  (`CLEF_READY_MESSAGE`; uvicorn's own line is never printed).

clef-tt also gets: CLEF_TT_SHIM = the ttnn shim the clef-tt wheel installed into this
environment (site-packages/clef_tt_shim/, beside its op package clef_tt_ttnn/), CLEF_TT_PYTHON
= this interpreter (the shim embeds CPython and takes this environment, where ttnn is
installed), and this interpreter's libpython folder on LD_LIBRARY_PATH (the shim links
libpython; the image's Python lives outside the linker's paths). Each only when not set
already. Everything else (HF_MODEL, TT_CACHE_PATH, MESH_DEVICE, the profile's CLEF_* settings)
passes through as tt-model set it.

Standard library only; importing it starts nothing (tt-model's build-time verify imports it,
and runs `check_shim()`: the shim, its embedded CPython and ttnn load without chips).
"""

import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig

#: Where the clef-tt wheel puts the ttnn shim, under this environment's site-packages.
SHIM_DIR = "clef_tt_shim"
SHIM = "libclef_tt_ttnn.so"

#: tt-model's ready line for this kind (it matches the substring "Application startup
#: complete"), written as uvicorn writes it.
READY_LINE = "INFO:     Application startup complete."

log = logging.getLogger("uvicorn.error")


class LaunchError(RuntimeError):
    """Why clef-tt cannot take over; reported to uvicorn as a failed startup."""


def clef_tt_binary():
    """CLEF_TT_BINARY, else the clef-tt of this interpreter's environment (the wheel installs
    it beside `python`), else the one on PATH."""
    named = os.environ.get("CLEF_TT_BINARY")
    if named:
        return named
    beside = os.path.join(os.path.dirname(sys.executable), "clef-tt")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("clef-tt")
    if found:
        return found
    raise LaunchError(
        f"clef-tt is not installed beside {sys.executable} nor on PATH: install the clef-tt wheel "
        "into this environment (or name the binary in CLEF_TT_BINARY)"
    )


def ttnn_shim():
    """The ttnn shim the clef-tt wheel installed into this environment (with its op package
    beside it), or None when the wheel was built without one."""
    paths = sysconfig.get_paths()
    for base in dict.fromkeys([paths["platlib"], paths["purelib"]]):
        folder = os.path.join(base, SHIM_DIR)
        shim = os.path.join(folder, SHIM)
        if os.path.isfile(shim) and os.path.isfile(
            os.path.join(folder, "clef_tt_ttnn", "__init__.py")
        ):
            return shim
    return None


def uvicorn_config():
    """The `uvicorn.config.Config` of the server running this lifespan: uvicorn's LifespanOn
    calls the app with itself (holding `config`) a few frames up the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        config = getattr(owner, "config", None)
        if type(config).__name__ == "Config" and type(config).__module__.startswith("uvicorn"):
            return config
        frame = frame.f_back
    return None


def socket_of(config):
    """(host, port) clef-tt must listen on, or why it cannot take over this server's socket."""
    if config is None:
        raise LaunchError(
            "this launcher hands uvicorn's socket to clef-tt, so it must run under uvicorn "
            "(python -m uvicorn --host H --port P --lifespan on launcher.clef_tt_asgi:app)"
        )
    if getattr(config, "uds", None) or getattr(config, "fd", None) is not None:
        raise LaunchError(
            "clef-tt listens on a TCP host and port: --uds and --fd are not supported"
        )
    if (getattr(config, "workers", None) or 1) > 1 or getattr(config, "reload", False):
        raise LaunchError(
            "clef-tt is one process with its own workers (CLEF_WORKERS): drop --workers/--reload"
        )
    return str(config.host), int(config.port)


def clef_tt_env(host, port, environ=None, python=None):
    """The environment clef-tt serves with: tt-model's, on uvicorn's socket."""
    env = dict(os.environ if environ is None else environ)
    python = python or sys.executable
    # clef-tt binds "HOST:PORT": an IPv6 address needs its brackets.
    env["CLEF_HOST"] = f"[{host}]" if ":" in host and not host.startswith("[") else host
    env["CLEF_PORT"] = str(port)
    env.setdefault("CLEF_READY_MESSAGE", READY_LINE)
    env.setdefault("CLEF_TT_PYTHON", python)
    shim = ttnn_shim()
    if shim:
        env.setdefault("CLEF_TT_SHIM", shim)
    libdir = sysconfig.get_config_var("LIBDIR")
    library = sysconfig.get_config_var("LDLIBRARY")
    if libdir and library and os.path.isfile(os.path.join(libdir, library)):
        paths = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
        if libdir not in paths:
            env["LD_LIBRARY_PATH"] = ":".join(paths + [libdir])
    return env


def check_shim():
    """The image-build check of the device path (a `verify` line): `clef-tt devices --device tt
    --check` in the environment serve gets. It loads the wheel's ttnn shim, starts the CPython
    it embeds on this interpreter (refusing another version), imports ttnn and the op package
    and checks ttnn's version; no chip is touched. Returns clef-tt's report; raises LaunchError
    with clef-tt's reason otherwise."""
    env = dict(clef_tt_env("127.0.0.1", 0), RUST_BACKTRACE="0")
    try:
        r = subprocess.run(
            [clef_tt_binary(), "devices", "--device", "tt", "--check"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"clef-tt devices --check did not run: {e}") from e
    if r.returncode != 0:
        text = r.stderr.split("Stack backtrace:")[0]
        reason = " ".join(ln.strip() for ln in text.splitlines() if ln.strip())
        raise LaunchError(
            "the ttnn shim does not load in this environment: " + (reason or f"exit {r.returncode}")
        )
    return r.stdout


def hand_over(config):
    """Replace this process with `clef-tt serve` on the server's socket; returns only by
    raising LaunchError."""
    host, port = socket_of(config)
    binary = clef_tt_binary()
    env = clef_tt_env(host, port)
    log.info("clef-tt takes over pid %d on %s:%d: %s serve", os.getpid(), host, port, binary)
    for handler in logging.getLogger().handlers + log.handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    # Signal dispositions that are handlers reset on exec; a blocked mask would be inherited.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:
        os.execve(binary, [binary, "serve"], env)
    except OSError as e:
        raise LaunchError(f"cannot run {binary}: {e}") from e


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        try:
            hand_over(uvicorn_config())
        except LaunchError as e:
            await send({"type": "lifespan.startup.failed", "message": str(e)})
        return
    if scope["type"] == "http":
        # Only reachable when the server skipped the lifespan (--lifespan off).
        body = (
            b'{"detail":[{"loc":[],"msg":"clef-tt was never started: run the launcher with '
            b'--lifespan on","type":"launcher_misconfigured"}]}'
        )
        await send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
