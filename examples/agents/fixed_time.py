"""A smoke test that runs for a fixed time, whatever the game day asks.

It ignores DOCKET_AGENT_CALLS and the other workload variables: it asks the
openai SDK (default retries) one question every 100 ms for RUN_FOR_S seconds,
logs what fails and goes on, then exits 0 (its summary line says what failed).
"""

from __future__ import annotations

import json
import sys
import time

import openai

RUN_FOR_S = 3.0
PAUSE_S = 0.1


def main() -> int:
    client = openai.OpenAI(timeout=5.0)
    deadline = time.monotonic() + RUN_FOR_S
    answered = failed = i = 0
    while time.monotonic() < deadline:
        i += 1
        try:
            client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": f"ping {i}: reply with pong"}],
                max_tokens=8,
            )
            answered += 1
        except openai.APIError as exc:
            failed += 1
            print(f"ping {i}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        time.sleep(PAUSE_S)
    print(json.dumps({"pings": i, "answered": answered, "failed": failed}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
