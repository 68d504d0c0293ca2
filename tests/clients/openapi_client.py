"""A Python client generated from clef-tt's OpenAPI document (openapi-python-client, unmodified
output) against a running server: a decision with all three question types parses into the
generated answer classes and equals the answer fetched without the client; /v1/models and
/health parse; a 422 parses as the generated error body.

    python openapi_client.py GENERATED_PACKAGE_PARENT BASE_URL
"""

import json
import sys
import urllib.error
import urllib.request

sys.path.insert(0, sys.argv[1])
base = sys.argv[2]

from clef_tt_client import Client  # noqa: E402
from clef_tt_client.api.default import decide, health, list_models  # noqa: E402
from clef_tt_client.models import (  # noqa: E402
    ChoiceAnswer,
    Error,
    HealthBody,
    ModelList,
    NoulAnswer,
    ScoreAnswer,
    SystemOneRequest,
    SystemOneResponse,
)

BODY = {
    "model": "clef",
    "state": "Our checkout started returning errors and orders are blocked.",
    "questions": {
        "outage": {"type": "noul", "instructions": "Is a service down?"},
        "team": {
            "type": "choice",
            "instructions": "Which team should handle the message?",
            "criteria": {"billing": "Payments or invoices", "technical": "Bugs or outages"},
        },
        "urgency": {"type": "score", "criteria": ["Can wait", "This week", "Today"]},
    },
}


def raw(body):
    req = urllib.request.Request(
        base + "/v1/systemone",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


client = Client(base_url=base)
reply = decide.sync_detailed(client=client, body=SystemOneRequest.from_dict(BODY))
assert reply.status_code == 200, reply
assert isinstance(reply.parsed, SystemOneResponse), type(reply.parsed)
answers = reply.parsed.answers.additional_properties
kinds = {k: type(a) for k, a in answers.items()}
assert kinds == {"outage": NoulAnswer, "team": ChoiceAnswer, "urgency": ScoreAnswer}, kinds
status, direct = raw(BODY)
assert status == 200
for key, answer in answers.items():
    assert answer.to_dict() == direct["answers"][key], (
        key,
        answer.to_dict(),
        direct["answers"][key],
    )
assert reply.parsed.usage.input_tokens == direct["usage"]["input_tokens"]

models = list_models.sync(client=client)
assert isinstance(models, ModelList) and models.models[0].name, models
assert isinstance(health.sync(client=client), HealthBody)

bad = dict(BODY, questions={"q": {"type": "choice", "criteria": {}}})
reply = decide.sync_detailed(client=client, body=SystemOneRequest.from_dict(bad))
assert reply.status_code == 422, reply.status_code
assert isinstance(reply.parsed, Error), type(reply.parsed)
assert reply.parsed.detail[0].loc == ["body", "questions", "q", "criteria"], reply.parsed.detail[0]
print(
    "generated client: a decision (noul, choice, score) equal to the direct answer, "
    "models, health, and a typed 422"
)
