"""The tt-model launcher (launcher/clef_tt_asgi.py) driven as uvicorn drives it: lifespan
startup starts clef-tt and completes only once it is ready, requests are relayed unchanged
(a decision, a 422, a 401 without the key), and lifespan shutdown stops the server.

usage: python tests/clients/launcher_test.py PATH_TO_CLEF_TT (stdlib only)
"""

import asyncio
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
os.environ["CLEF_TT_BINARY"] = sys.argv[1]
os.environ["CLEF_TT_INTERNAL_PORT"] = "18809"
os.environ["CLEF_API_KEY"] = "launcher-key"
os.environ["CLEF_WARMUP"] = "1"

from launcher import clef_tt_asgi  # noqa: E402


class Lifespan:
    """The lifespan protocol as uvicorn runs it: one task for the server's whole life."""

    def __init__(self):
        self.queue = asyncio.Queue()
        self.sent = asyncio.Queue()

        async def send(m):
            await self.sent.put(m)

        self.task = asyncio.create_task(clef_tt_asgi.app({"type": "lifespan"}, self.queue.get, send))

    async def event(self, kind):
        await self.queue.put({"type": kind})
        return await asyncio.wait_for(self.sent.get(), 600)


async def http(method, path, body=b"", headers=()):
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return chunks.pop(0)

    sent = []

    async def send(m):
        sent.append(m)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in headers] + [(b"host", b"example")],
    }
    await clef_tt_asgi.app(scope, receive, send)
    start, body_msg = sent
    return start["status"], dict(start["headers"]), body_msg["body"]


async def main():
    life = Lifespan()
    startup = await life.event("lifespan.startup")
    assert startup == {"type": "lifespan.startup.complete"}, startup
    auth = [("authorization", "Bearer launcher-key"), ("content-type", "application/json")]
    status, _, body = await http("GET", "/health")
    assert status == 200, body
    request = {
        "model": "clef",
        "state": "Our checkout started returning errors and orders are blocked.",
        "questions": {"outage": {"type": "noul", "instructions": "Is a service down?"}},
    }
    status, headers, body = await http("POST", "/v1/systemone", json.dumps(request).encode(), auth)
    assert status == 200, body
    answer = json.loads(body)
    assert answer["answers"]["outage"]["type"] == "noul", answer
    assert b"x-request-id" in headers and headers[b"content-length"] == str(len(body)).encode()
    status, _, body = await http("POST", "/v1/systemone", b'{"model": "clef"}', auth)
    assert status == 422 and b"detail" in body, body
    status, _, _ = await http("POST", "/v1/systemone", json.dumps(request).encode(), auth[1:])
    assert status == 401
    shutdown = await life.event("lifespan.shutdown")
    assert shutdown == {"type": "lifespan.shutdown.complete"}, shutdown
    await asyncio.wait_for(life.task, 60)
    assert clef_tt_asgi.launcher.proc.poll() == 0, clef_tt_asgi.launcher.proc.returncode
    print("launcher: startup, relay (200, 422, 401) and shutdown ok")


asyncio.run(main())
