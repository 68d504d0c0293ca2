"""The tt-model launcher (launcher/clef_tt_asgi.py) started exactly as tt-model's tt-dit-server
kind starts it — `python -m uvicorn --host 0.0.0.0 --port P --lifespan on
launcher.clef_tt_asgi:app` with the package's default profile in the environment, the weights
in HF_MODEL and the tensor cache mount in TT_CACHE_PATH — from an environment that has only the
clef-tt wheel and uvicorn, on the CPU (CLEF_DEVICE=cpu). Checked against a direct
`clef-tt serve` of the same wheel:

- tt-model's ready line comes only once /health answers 200, from the process tt-model started;
- every Python client reads the refusal of an oversize body (oversize_bodies.py);
- the README request, 413, 422, 401 and 429 (a burst past the queue, with Retry-After) arrive
  as clef-tt answers them directly; one date header, no uvicorn server header;
- /health during a burst costs what it costs directly;
- the first start converts the weights into TT_CACHE_PATH, the next one loads them;
- SIGTERM stops it within tt-model's 120 s (with requests in flight: within
  CLEF_SHUTDOWN_TIMEOUT), SIGKILL leaves no clef-tt, a server already on the port makes the
  start fail, a launch it cannot serve (--uds) fails the start with the reason.

usage: python launcher_test.py --python VENV/bin/python --code CODE_DIR --manifest
       tt_kernel_manifest.json --model MODEL_DIR --work SCRATCH   (stdlib only)
"""

import argparse
import http.client
import http.server
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

READY = "Application startup complete"
STOP_WINDOW = 120  # tt-model: docker stop --timeout 120
KEY = "launcher-key"
README_REQUEST = {
    "model": "clef",
    "state": "Our checkout started returning errors and orders are blocked.",
    "questions": {
        "department": {
            "type": "choice",
            "instructions": "Which team should handle the message?",
            "criteria": {"billing": "Payments or invoices", "technical": "Bugs or outages"},
        },
        "urgency": {"type": "score", "criteria": ["Can wait", "This week", "Today"]},
        "outage": {"type": "noul", "instructions": "Is a service down?"},
    },
}
# Per response: not part of the answer.
VOLATILE_HEADERS = {"date", "x-request-id", "x-typesafe-request-id", "content-length"}
VOLATILE_FIELDS = {"id", "request_id", "latency_ms", "usage", "created"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None, headers=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.getheaders(), r.read()
    finally:
        conn.close()


def too_big(port, size=14 << 20):
    """A body over the limit, sent as urllib and requests send it: all of it, then the answer
    is read (clef-tt drains a refused body so the client reads its 413)."""
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(
            f"POST /v1/systemone HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer {KEY}\r\ncontent-length: {size}\r\n\r\n".encode()
        )
        sock.sendall(b"x" * size)
        r = http.client.HTTPResponse(sock)
        r.begin()
        return r.status, r.getheaders(), r.read()


def decide(port, payload, key=KEY):
    headers = {"content-type": "application/json"}
    if key:
        headers["authorization"] = f"Bearer {key}"
    return request(port, "POST", "/v1/systemone", json.dumps(payload).encode(), headers)


def scrub(body):
    """The body without per-response fields."""
    try:
        value = json.loads(body)
    except ValueError:
        return body

    def walk(v):
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items() if k not in VOLATILE_FIELDS}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(value)


def same_answer(a, b, what):
    (sa, ha, ba), (sb, hb, bb) = a, b
    assert sa == sb, f"{what}: status {sa} through the launcher, {sb} direct"
    assert scrub(ba) == scrub(bb), f"{what}: bodies differ\n{ba[:400]!r}\n{bb[:400]!r}"
    names = lambda h: sorted({k.lower() for k, _ in h} - VOLATILE_HEADERS)  # noqa: E731
    assert names(ha) == names(hb), f"{what}: headers {names(ha)} vs {names(hb)}"
    assert [k.lower() for k, _ in ha].count("date") == 1, ha
    assert not any(k.lower() == "server" for k, _ in ha), ha


class Server:
    """A process serving on `port`; its log lines collected as they come."""

    def __init__(self, argv, env, port, cwd):
        self.port = port
        self.lines = []
        self.ready_at = None
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if READY in line and not self.ready.is_set():
                self.ready_at = time.monotonic()
                self.ready.set()

    def log(self):
        return "\n".join(self.lines[-40:])

    def wait_ready(self, timeout=300):
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.05):
            assert self.proc.poll() is None, (
                f"exited with {self.proc.returncode} before ready:\n{self.log()}"
            )
            assert time.monotonic() < deadline, f"not ready after {timeout} s:\n{self.log()}"

    def stop(self, sig=signal.SIGTERM, timeout=STOP_WINDOW):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        t0 = time.monotonic()
        code = self.proc.wait(timeout)
        return code, time.monotonic() - t0


class Suite:
    def __init__(self, a):
        self.a = a
        self.bin = os.path.join(os.path.dirname(a.python), "clef-tt")
        with open(a.manifest) as f:
            c = json.load(f)["container"]
        profile = next(p for p in c["serve_profiles"] if p["name"] == c["default_profile"])
        env = dict(c["serve"]["env"], **profile["env"])
        # What tt-model's launcher and docker run add (launchers.py, container.py), then the CPU.
        rows, cols = {"P150x2": (1, 2), "P150x4": (1, 4)}[profile["mesh_device"]]
        env.update(
            {
                "HF_MODEL": a.model,
                "MESH_DEVICE": profile["mesh_device"],
                c["runtime"]["mesh_shape_env"]: f"{rows}x{cols}",
                **profile["env"],
                "TT_CACHE_PATH": os.path.join(a.work, "tensor-cache"),
                "HF_HOME": os.path.join(a.work, "hf"),
                "CLEF_DEVICE": "cpu",
                "CLEF_API_KEY": KEY,
            }
        )
        self.env = dict(os.environ, **env)
        # The image: the venv first on PATH, code/ on PYTHONPATH, a work dir as the cwd.
        self.env["PATH"] = os.path.dirname(a.python) + os.pathsep + os.environ.get("PATH", "")
        self.env["PYTHONPATH"] = a.code
        self.cwd = os.path.join(a.work, "cwd")
        os.makedirs(self.cwd, exist_ok=True)
        self.cache_manifest = os.path.join(
            env["TT_CACHE_PATH"], "clef-tt", "cpu-1x2-selected", "manifest.json"
        )

    def launcher(self, port=None, extra_env=None, args=()):
        port = port or free_port()
        argv = [
            self.a.python,
            "-m",
            "uvicorn",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
            "--lifespan",
            "on",
            *args,
            "launcher.clef_tt_asgi:app",
        ]
        return Server(argv, dict(self.env, **(extra_env or {})), port, self.cwd)

    def direct(self):
        port = free_port()
        env = dict(self.env, CLEF_HOST="127.0.0.1", CLEF_PORT=str(port))
        s = Server([self.bin, "serve"], env, port, self.cwd)
        deadline = time.monotonic() + 300
        while True:
            try:
                if request(port, "GET", "/health", timeout=2)[0] == 200:
                    return s
            except OSError:
                pass
            assert s.proc.poll() is None and time.monotonic() < deadline, s.log()
            time.sleep(0.05)

    def clef_tt_pids(self):
        """Processes running the wheel's clef-tt."""
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.path.realpath(f"/proc/{entry}/exe") == os.path.realpath(self.bin):
                        pids.append(int(entry))
                except OSError:
                    pass
        return pids

    def burst(self, port, n, repeat=40):
        """n decisions at once (distinct states, so no prefix cache hit); their answers."""
        results = [None] * n
        gate = threading.Barrier(n)

        def one(i):
            payload = dict(README_REQUEST, state=f"{i}: " + README_REQUEST["state"] * repeat)
            gate.wait()
            try:
                results[i] = decide(port, payload)
            except OSError as e:
                results[i] = (None, [], str(e).encode())

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        return threads, results

    def health_during_burst(self, port, n=100):
        threads, results = self.burst(port, n)
        times = []
        while any(t.is_alive() for t in threads) and len(times) < 40:
            t0 = time.perf_counter()
            status, _, _ = request(port, "GET", "/health")
            times.append((time.perf_counter() - t0) * 1000)
            assert status == 200
            time.sleep(0.01)
        for t in threads:
            t.join()
        return statistics.median(times), results

    def run(self):
        before = set(self.clef_tt_pids())
        assert not before, f"clef-tt already running: {before}"

        # 1. Ready only after clef-tt is healthy, from the process tt-model started.
        lp = free_port()
        launched = self.launcher(lp)
        # Probes while it starts, each as (sent at, status). clef-tt writes the line a moment
        # after /health turns 200, so a probe may see 200 just before the line is read; what
        # must never happen is a 503 sent after the line was read, or after a 200.
        early = []
        while not launched.ready.is_set():
            assert launched.proc.poll() is None, launched.log()
            sent = time.monotonic()
            try:
                early.append((sent, request(lp, "GET", "/health", timeout=0.5)[0]))
            except OSError:
                pass
            time.sleep(0.02)
        status, _, body = request(lp, "GET", "/health")
        assert status == 200, body
        codes = [code for _, code in early]
        healthy = codes.index(200) if 200 in codes else len(codes)
        assert all(code == 200 for code in codes[healthy:]), f"/health went back from 200: {codes}"
        late = [code for sent, code in early if sent >= launched.ready_at and code != 200]
        assert not late, f"/health said {late} after the ready line"
        if 200 in codes:
            lag = launched.ready_at - early[healthy][0]
            assert lag < 2.0, f"the ready line came {lag:.2f} s after /health said 200"
        assert os.path.realpath(f"/proc/{launched.proc.pid}/exe") == os.path.realpath(self.bin), (
            "the process tt-model started does not serve"
        )
        assert os.path.isfile(self.cache_manifest), "the first start wrote no tensor cache"
        print(
            f"launcher: ready line with /health 200 ({len(early)} earlier probes: "
            f"{codes.count(503)} x 503, then {codes.count(200)} x 200); "
            f"clef-tt serves as pid {launched.proc.pid}"
        )

        direct = self.direct()
        dp = direct.port

        # 2. The README request, 422, 401, 413 as direct.
        same_answer(decide(lp, README_REQUEST), decide(dp, README_REQUEST), "README request")
        assert decide(lp, README_REQUEST)[0] == 200
        same_answer(decide(lp, {"model": "clef"}), decide(dp, {"model": "clef"}), "422")
        assert decide(lp, {"model": "clef"})[0] == 422
        same_answer(
            decide(lp, README_REQUEST, key=None), decide(dp, README_REQUEST, key=None), "401"
        )
        assert decide(lp, README_REQUEST, key=None)[0] == 401
        same_answer(too_big(lp), too_big(dp), "413")
        assert too_big(lp)[0] == 413
        print("launcher: README request 200, 422, 401 and 413 as clef-tt answers them directly")
        # Every Python client reads the refusals of bodies over the limit (14, 64 MiB, chunked)
        # and of another content type, through the launcher.
        oversize = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oversize_bodies.py")
        r = subprocess.run(
            [
                self.a.clients_python or sys.executable,
                oversize,
                f"http://127.0.0.1:{lp}",
                "--key",
                KEY,
            ],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert not (self.a.clients_python and "skipped" in r.stdout), r.stdout
        print(f"launcher: {r.stdout.strip().splitlines()[-1]}")

        # 3. A burst past the queue: 429 with Retry-After; /health as fast as direct.
        direct_health, direct_results = self.health_during_burst(dp)
        launcher_health, results = self.health_during_burst(lp)
        codes = [r[0] for r in results]
        busy = [r for r in results if r[0] == 429]
        assert busy, (
            f"no 429 in a burst of {len(results)} past a queue of {self.env['CLEF_MAX_QUEUE']}: {codes}"
        )
        assert set(codes) <= {200, 429}, codes
        assert all(any(k.lower() == "retry-after" for k, _ in r[1]) for r in busy)
        direct_busy = next(r for r in direct_results if r[0] == 429)
        same_answer(busy[0], direct_busy, "429")
        assert launcher_health <= max(2 * direct_health, direct_health + 5), (
            f"/health median {launcher_health:.1f} ms through the launcher, {direct_health:.1f} ms direct"
        )
        print(
            f"launcher: burst of {len(codes)}: {codes.count(200)} x 200, {len(busy)} x 429 with Retry-After; "
            f"/health median {launcher_health:.2f} ms (direct {direct_health:.2f} ms)"
        )

        # 4. SIGTERM: stops within the window, nothing left.
        code, took = launched.stop(signal.SIGTERM)
        assert code == 0, f"exit {code}:\n{launched.log()}"
        assert launched.proc.pid not in self.clef_tt_pids()
        print(f"launcher: SIGTERM -> exit 0 in {took:.2f} s")

        # 5. The second start loads the tensor cache; SIGTERM with requests in flight stops
        #    within CLEF_SHUTDOWN_TIMEOUT.
        written = os.stat(self.cache_manifest).st_mtime_ns
        again = self.launcher(extra_env={"CLEF_SHUTDOWN_TIMEOUT": "2"})
        again.wait_ready()
        assert os.stat(self.cache_manifest).st_mtime_ns == written, (
            "the second start rewrote the tensor cache"
        )
        threads, results = self.burst(again.port, 60, repeat=250)
        time.sleep(0.5)
        code, took = again.stop(signal.SIGTERM)
        for t in threads:
            t.join()
        assert code == 0 and took < 2 + 5, f"exit {code} after {took:.1f} s:\n{again.log()}"
        unanswered = sum(1 for r in results if r[0] is None)
        assert unanswered, "the burst finished before the deadline: make it longer"
        print(
            f"launcher: second start loads the tensor cache; SIGTERM with requests in flight -> exit 0 in {took:.2f} s"
        )

        # 6. SIGKILL leaves no clef-tt: when ready, and while it loads.
        killed = self.launcher()
        killed.wait_ready()
        killed.stop(signal.SIGKILL, timeout=10)
        early_kill = self.launcher()
        while not any("takes over" in line for line in early_kill.lines):
            assert early_kill.proc.poll() is None, early_kill.log()
            time.sleep(0.01)
        early_kill.stop(signal.SIGKILL, timeout=10)
        left = set(self.clef_tt_pids()) - {direct.proc.pid}
        assert not left, f"clef-tt left running after SIGKILL: {left}"
        print("launcher: SIGKILL (ready, and while loading) leaves no clef-tt")

        # 7. Something already on the port: the start fails, and never reports ready.
        foreign_port = free_port()
        foreign = http.server.ThreadingHTTPServer(("0.0.0.0", foreign_port), Healthy)
        threading.Thread(target=foreign.serve_forever, daemon=True).start()
        try:
            blocked = self.launcher(foreign_port)
            code = blocked.proc.wait(60)
            assert code != 0 and not blocked.ready.is_set(), blocked.log()
            assert request(foreign_port, "GET", "/health")[0] == 200
        finally:
            foreign.shutdown()
        print(f"launcher: a server already on the port -> exit {code}, no ready line")

        # 8. A launch clef-tt cannot take over fails the start with the reason.
        uds = self.launcher(args=("--uds", os.path.join(self.a.work, "sock")))
        code = uds.proc.wait(60)
        assert code != 0 and "--uds" in uds.log() and not uds.ready.is_set(), uds.log()
        print("launcher: --uds -> startup failed with the reason")

        code, _ = direct.stop(signal.SIGTERM)
        assert code == 0
        assert not self.clef_tt_pids(), self.clef_tt_pids()


class Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"status":"ok"}'
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    p = argparse.ArgumentParser()
    for name in ("python", "code", "manifest", "model", "work"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument(
        "--clients-python",
        help="a Python with requests, httpx and typesafe-sdk for "
        "oversize_bodies.py (default: this one, urllib alone)",
    )
    a = p.parse_args()
    a.work = os.path.abspath(a.work)
    Suite(a).run()
    print("launcher: all checks passed")


if __name__ == "__main__":
    sys.exit(main())
