"""The ASGI launcher tt-model runs for clef-tt.

tt-model's `tt-dit-server` kind serves a Python ASGI app with uvicorn
(`python -m uvicorn --host 0.0.0.0 --port <port> --lifespan on launcher.clef_tt_asgi:app`) and
waits for "Application startup complete". clef-tt is a Rust binary, so this app is the smallest
bridge: at lifespan startup it starts `clef-tt serve` on a private loopback port with the serve
settings tt-model put in the environment, waits until its /health answers 200 (so uvicorn
reports startup complete only when the model is ready), relays every HTTP request to it
unchanged, and stops it with SIGTERM at shutdown (clef-tt finishes the requests in flight).
Standard library only; importing it touches no hardware.
"""

import asyncio
import http.client
import json
import os
import shutil
import signal
import subprocess
import time

BINARY = os.environ.get("CLEF_TT_BINARY") or shutil.which("clef-tt") or "/opt/clef-tt/bin/clef-tt"
INTERNAL_PORT = int(os.environ.get("CLEF_TT_INTERNAL_PORT", "18808"))
START_TIMEOUT = float(os.environ.get("CLEF_TT_START_TIMEOUT", "3600"))
# Hop-by-hop headers are the relay's own business.
HOP = {"connection", "keep-alive", "transfer-encoding", "host", "upgrade"}


class Launcher:
    def __init__(self):
        self.proc = None

    def start(self):
        env = dict(os.environ, CLEF_HOST="127.0.0.1", CLEF_PORT=str(INTERNAL_PORT))
        self.proc = subprocess.Popen([BINARY, "serve"], env=env)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"clef-tt serve exited with status {self.proc.returncode}")
            try:
                if self.relay("GET", "/health", b"", {})[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"clef-tt serve was not ready after {START_TIMEOUT:.0f} s")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=900)

    def relay(self, method, path, body, headers):
        conn = http.client.HTTPConnection("127.0.0.1", INTERNAL_PORT, timeout=3600)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()


launcher = Launcher()


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await asyncio.to_thread(launcher.start)
                except Exception as e:  # reported to uvicorn, which exits
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(launcher.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    path = scope.get("raw_path") or scope["path"].encode()
    path = path.decode("latin-1")
    if scope.get("query_string"):
        path += "?" + scope["query_string"].decode("latin-1")
    headers = {
        k.decode("latin-1"): v.decode("latin-1")
        for k, v in scope["headers"]
        if k.decode("latin-1").lower() not in HOP
    }
    try:
        status, upstream, data = await asyncio.to_thread(launcher.relay, scope["method"], path, body, headers)
    except OSError as e:
        status, upstream = 502, [("content-type", "application/json")]
        data = json.dumps({"detail": [{"loc": [], "msg": f"clef-tt is not reachable: {e}", "type": "bad_gateway"}]}).encode()
    out = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in upstream if k.lower() not in HOP]
    if not any(k == b"content-length" for k, _ in out):
        out.append((b"content-length", str(len(data)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": data})
