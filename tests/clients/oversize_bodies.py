"""Refusals every Python client can read: bodies the server refuses before reading them (413 over
the body limit, 401 without the key, 415 for another content type), sent with urllib, requests,
httpx and the official SDK (typesafe-sdk 0.7.x, unmodified), with a Content-Length and chunked,
to /v1/systemone and to the Workers AI route. Each client must read the status and the JSON
error body; a broken pipe or a reset is a failure.

Usage: python tests/clients/oversize_bodies.py BASE_URL [--key KEY] [--clients urllib,...]
         [--mib 14,64] [--chunked-mib 14]

BASE_URL serves with the default body limit (13 MiB) and, with --key, with CLEF_API_KEY=KEY.
Clients not importable here are skipped with a note (urllib always runs). Prints
"N passed, 0 failed" and exits non-zero on the first failure.
"""

import argparse
import json
import sys
import urllib.error
import urllib.request

SYSTEMONE = "/v1/systemone"
WORKERS_AI = "/client/v4/accounts/acct/ai/run/@cf/cloudflare/clef"
MIB = 1 << 20
PIECE = 256 << 10


def body_of(n):
    """A JSON request of about n bytes (its state a long run of words)."""
    head = b'{"model":"clef","questions":{"q":{"type":"noul","instructions":"?"}},"state":"'
    tail = b'"}'
    filler = n - len(head) - len(tail)
    return head + (b"word " * (filler // 5 + 1))[:filler] + tail


def pieces(n):
    """The same body as an iterator of pieces: the clients send it chunked."""
    data = body_of(n)
    for i in range(0, len(data), PIECE):
        yield data[i : i + PIECE]


def check_error(route, status, want, text):
    assert status == want, f"status {status}, expected {want}: {text[:300]}"
    body = json.loads(text)
    if route == WORKERS_AI:
        assert body["success"] is False and body["errors"][0]["message"], body
    else:
        assert body["error"]["message"] and body["detail"][0]["msg"], body
    return body


def send_urllib(url, data, headers):
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def send_requests(url, data, headers):
    import requests

    r = requests.post(url, data=data, headers=headers, timeout=120)
    return r.status_code, r.text


def send_httpx(url, data, headers):
    import httpx

    r = httpx.post(url, content=data, headers=headers, timeout=120)
    return r.status_code, r.text


SENDERS = {"urllib": send_urllib, "requests": send_requests, "httpx": send_httpx}


def importable(name):
    try:
        __import__({"sdk": "typesafe_sdk"}.get(name, name))
        return True
    except ImportError:
        return False


def sdk_oversize(base, key, n):
    """The SDK's own call with a state of n bytes: its typed error carries the 413."""
    import typesafe_sdk
    from typesafe_sdk import Noul, TypeSafeClient

    # Its default retries stay on, as a user has them: a transport error would be retried.
    client = TypeSafeClient(
        api_key=key or "any-key", base_url=base, model="clef", compression=False
    )
    try:
        client.system_one(state="word " * (n // 5), questions={"q": Noul(instructions="?")})
    except typesafe_sdk.TypeSafeAPIError as e:
        status = e.status
        assert status == 413, f"the SDK's error has status {status}: {e}"
        assert "larger than" in str(e), f"the SDK's error lacks the server's message: {e}"
        return
    raise AssertionError("a body over the limit was accepted")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--key")
    ap.add_argument("--clients", default="urllib,requests,httpx,sdk")
    ap.add_argument("--mib", default="14,64")
    ap.add_argument("--chunked-mib", default="14")
    a = ap.parse_args()
    base = a.base.rstrip("/")
    auth = {"Authorization": f"Bearer {a.key}"} if a.key else {}
    json_ct = {"Content-Type": "application/json"}
    checks = 0
    for client in a.clients.split(","):
        if not importable(client) and client != "urllib":
            print(f"{client}: not installed here, skipped")
            continue
        if client == "sdk":
            for mib in a.mib.split(","):
                sdk_oversize(base, a.key, int(mib) * MIB)
                checks += 1
            print(f"sdk: 413 read for {a.mib} MiB states")
            continue
        send = SENDERS[client]
        for route in (SYSTEMONE, WORKERS_AI):
            url = base + route
            cases = [
                (f"{mib} MiB", lambda m=int(mib): body_of(m * MIB)) for mib in a.mib.split(",")
            ]
            cases += [
                (f"{mib} MiB chunked", lambda m=int(mib): pieces(m * MIB))
                for mib in a.chunked_mib.split(",")
            ]
            for _name, data in cases:
                status, text = send(url, data(), {**json_ct, **auth})
                check_error(route, status, 413, text)
                checks += 1
                if a.key:
                    # No key: refused (401) before the body is read.
                    status, text = send(url, data(), json_ct)
                    check_error(route, status, 401, text)
                    checks += 1
            # Another content type: refused (415) before the body is read.
            status, text = send(url, body_of(4 * MIB), {"Content-Type": "text/plain", **auth})
            check_error(route, status, 415, text)
            checks += 1
            print(f"{client} {route}: refusals read ({', '.join(n for n, _ in cases)}, 415)")
    print(f"oversize bodies: {checks} passed, 0 failed")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line per failure, with the client's own exception
        print(f"oversize bodies: FAILED: {type(e).__name__}: {e}")
        sys.exit(1)
