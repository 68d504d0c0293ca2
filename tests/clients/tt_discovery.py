"""Tenstorrent's `tt` CLI (PyPI `tenstorrent`, unmodified) finds a running clef-tt.

`tt` discovers servers with `tenstorrent.launchers.discovery.discover(base_url)`: one unauthenticated
`GET {base_url}/models`, OpenAI's list shape, every `data` entry with an `id` a served model.
This runs that function as a user of `tt model ps` / `tt serve` would hit it, against a live
`clef-tt serve`, and checks it reports exactly the names the server's own cards list.

    python tt_discovery.py http://127.0.0.1:PORT
"""

import json
import sys
import urllib.request

from tenstorrent.launchers.discovery import discover, probe

base = sys.argv[1].rstrip("/")
found = discover(base + "/v1")
with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
    cards = json.load(r)["models"]
ids = [m.served_id for m in found]
names = [c["name"] for c in cards]
assert ids == names, (ids, names)
assert all(m.base_url == base + "/v1" for m in found), found
assert probe(base + "/v1") is not None
print("tt discovery: %s at %s" % (", ".join(ids), base))
