"""The official Python SDK (typesafe-sdk 0.7.x), unmodified, against a running clef-tt.

Usage: python tests/clients/python_sdk.py http://127.0.0.1:PORT
Runs a text request with all three question types and models.list(); the SDK's strict pydantic
parser must accept every response. Prints "N passed, 0 failed" and exits non-zero on failure.
"""

import sys

import typesafe_sdk
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient


def main(base_url: str) -> int:
    client = TypeSafeClient(api_key="any-key", base_url=base_url, model="clef", compression=False)
    checks = 0
    models = client.models.list()
    names = (
        [m.name for m in models.models] if hasattr(models, "models") else [m.name for m in models]
    )
    assert names, "models.list() returned no models"
    checks += 1
    resp = client.system_one(
        state={"message": "Our checkout started returning errors and orders are blocked."},
        questions={
            "department": Choice(
                instructions="Which team should handle the message?",
                criteria={"billing": "Payments or invoices", "technical": "Bugs or outages"},
            ),
            "urgency": Score(
                instructions="How urgent is it?", criteria=["Can wait", "This week", "Today"]
            ),
            "outage": Noul(instructions="Is a service down?"),
        },
    )
    answers = resp.answers
    choice = answers["department"]
    assert choice.choice in ("billing", "technical"), choice
    assert abs(sum(choice.probabilities.values()) - 1.0) < 2e-4, choice.probabilities
    score = answers["urgency"]
    assert len(score.legend) == 3 and 0.0 <= score.score <= 2.0, score
    assert 0.0 <= answers["outage"].noul <= 1.0
    assert resp.usage.input_tokens > 0
    checks += 1
    try:
        client.system_one(
            state="x",
            questions={"q": Noul(instructions="?")},
            model=None,
            extra_body={"model": None},
        )
        raise AssertionError("a null model was accepted")
    except typesafe_sdk.TypeSafeAPIError as e:  # the 422 maps to a typed error
        assert getattr(e, "status_code", 422) == 422, e
    checks += 1
    print(f"python sdk {typesafe_sdk.__version__}: {checks} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
