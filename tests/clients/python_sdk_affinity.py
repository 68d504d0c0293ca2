"""The official Python SDK (typesafe-sdk 0.7.x), unmodified and as an application uses it (no
x-clef-state-key, default settings), sending repeated text states to clef-tt replicas behind
HAProxy (deploy/haproxy/haproxy.cfg). tests/haproxy.rs runs it and judges the affinity.

Usage: python tests/clients/python_sdk_affinity.py BASE_URL ROUNDS < STATES_JSON

STATES_JSON is a JSON list of state strings. The script sends every state once per round
(ROUNDS rounds, states in order within a round) with two questions, and prints one JSON line
per request: the state's index, the round, the SDK's request id and the response headers that
say where the request went (x-clef-replica), how it used the prefix cache
(x-clef-prefix-cache), the server's routing key (x-clef-state-key) and the key HAProxy
balanced on (x-clef-balance-key, absent when it went round-robin).
"""

import json
import sys

from typesafe_sdk import Choice, Noul, TypeSafeClient


def main(base_url: str, rounds: int) -> int:
    states = json.load(sys.stdin)
    client = TypeSafeClient(api_key="any-key", base_url=base_url, model="clef")
    for round_ in range(rounds):
        for index, state in enumerate(states):
            resp = client.system_one(
                state=state,
                questions={
                    "outage": Noul(instructions="Is a service down?"),
                    "team": Choice(
                        instructions="Which team?",
                        criteria={"billing": "Payments", "technical": "Bugs and outages"},
                    ),
                },
            )
            headers = resp.raw_http_response.headers
            assert 0.0 <= resp.answers["outage"].noul <= 1.0
            print(
                json.dumps(
                    {
                        "state": index,
                        "round": round_,
                        "request_id": resp.request_id,
                        "x-request-id": headers.get("x-request-id"),
                        "replica": headers.get("x-clef-replica"),
                        "cache": headers.get("x-clef-prefix-cache"),
                        "state_key": headers.get("x-clef-state-key"),
                        "balance_key": headers.get("x-clef-balance-key"),
                    }
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
