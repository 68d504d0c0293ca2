"""clef-router 0.3.0 (PyPI, unmodified), a Workers AI Clef client, against clef-tt serve: only
its base URL is pointed at the server (any account id and token). A decision with all three
question types parses and equals the direct /v1/systemone answer; its typed errors fire for a
422 (ClefAPIError, code 5012), a 401 (ClefAuthError, code 10000) and a 429 (ClefRateLimitError
with Retry-After).

    python workers_ai_clef_router.py OPEN_BASE_URL KEYED_BASE_URL KEY BUSY_BASE_URL

OPEN is a server without a key, KEYED one with CLEF_API_KEY=KEY, BUSY one with one worker and
a queue of one (--max-queue 1).
"""

import json
import sys
import threading
import urllib.request

from clef_router import ClefRouter
from clef_router.errors import ClefAPIError, ClefAuthError, ClefRateLimitError
from clef_router.models import ChoiceAnswer, NoulAnswer, ScoreAnswer

open_base, keyed_base, key, busy_base = sys.argv[1:5]

STATE = "Our checkout started returning errors and orders are blocked."
QUESTIONS = {
    "outage": {"type": "noul", "instructions": "Is a service down?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle the message?",
        "criteria": {"billing": "Payments or invoices", "technical": "Bugs or outages"},
    },
    "urgency": {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["Can wait", "This week", "Today"],
    },
}


def router(base, token="any-token"):
    return ClefRouter(
        account_id="any-account",
        api_token=token,
        base_url=base + "/client/v4",
        max_retries=0,
        timeout=120,
    )


def direct(base, body):
    req = urllib.request.Request(
        base + "/v1/systemone",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req) as r:
        return json.load(r)


with router(open_base) as r:
    decision = r.decide(STATE, QUESTIONS)
    selector = r.config.model_selector  # clef-flash unless CLEF_MODEL says otherwise
want = direct(open_base, {"model": selector, "state": STATE, "questions": QUESTIONS})
kinds = {k: type(a) for k, a in decision.answers.items()}
assert kinds == {"outage": NoulAnswer, "team": ChoiceAnswer, "urgency": ScoreAnswer}, kinds
a = decision.answers
assert a["outage"].noul == want["answers"]["outage"]["noul"]
assert a["team"].choice == want["answers"]["team"]["choice"]
assert a["team"].probabilities == want["answers"]["team"]["probabilities"]
assert a["urgency"].score == want["answers"]["urgency"]["score"]
assert a["urgency"].probabilities == want["answers"]["urgency"]["probabilities"]
assert decision.usage.input_tokens == want["usage"]["input_tokens"]
result = dict(decision.raw_response["result"])
result.pop("latency_ms")
want.pop("latency_ms")
assert result == want, (result, want)
print("clef-router: a decision (noul, choice, score) equal to the direct answer")

# 422: an image the server cannot read (the client checks only counts).
broken = [{"content_type": "image/png", "base64": "bm90IGFuIGltYWdl"}]
try:
    with router(open_base) as r:
        r.decide(STATE, QUESTIONS, images=broken)
    raise SystemExit("no error for an unreadable image")
except ClefAPIError as e:
    assert type(e) is ClefAPIError and e.status_code == 422 and e.error_code == 5012, vars(e)
    print("clef-router: 422 ->", type(e).__name__, e.error_code)

# 401: a wrong token on a server with a key.
try:
    with router(keyed_base, token="wrong") as r:
        r.decide(STATE, QUESTIONS)
    raise SystemExit("no error for a wrong token")
except ClefAuthError as e:
    assert e.status_code == 401 and e.error_code == 10000, vars(e)
    print("clef-router: 401 ->", type(e).__name__, e.error_code)
with router(keyed_base, token=key) as r:
    assert r.decide(STATE, QUESTIONS).answers["outage"].noul == decision.answers["outage"].noul

# 429: eight clients at once on one worker with a queue of one.
long_state = "busy text " * 1500
errors, answered = [], []


def one():
    try:
        with router(busy_base) as r:
            answered.append(r.decide(long_state, QUESTIONS))
    except ClefRateLimitError as e:
        errors.append(e)


threads = [threading.Thread(target=one) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert errors, "no 429 from a queue of one under 8 clients"
assert all(e.error_code == 3040 and e.retry_after == 1.0 for e in errors), [vars(e) for e in errors]
assert len(errors) + len(answered) == 8
print(
    f"clef-router: 429 -> ClefRateLimitError 3040, retry_after 1 ({len(errors)} of 8; {len(answered)} answered)"
)
