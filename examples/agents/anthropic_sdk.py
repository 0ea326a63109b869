"""A batch job on the anthropic SDK, non-streaming (`client.messages.create`).

`anthropic.Anthropic()` reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY; the SDK's
retries are at their default (max_retries=2, honouring Retry-After); a task that
still fails is logged and skipped. Tasks: DOCKET_AGENT_CALLS (10 otherwise).
Exits 0 once every task was tried (the
failures are in its summary line).
"""

from __future__ import annotations

import json
import os
import sys

import anthropic

TASKS = int(os.environ.get("DOCKET_AGENT_CALLS", "10"))
TIMEOUT = float(os.environ.get("DOCKET_AGENT_TIMEOUT", "10"))
MAX_TOKENS = int(os.environ.get("DOCKET_AGENT_MAX_TOKENS", "32"))


def main() -> int:
    client = anthropic.Anthropic(timeout=TIMEOUT)
    answered = failed = 0
    for i in range(TASKS):
        try:
            message = client.messages.create(
                model="claude-3-5-haiku-latest",
                max_tokens=MAX_TOKENS,
                system="Answer in one short sentence.",
                messages=[{"role": "user", "content": f"Classify support email #{i}."}],
            )
        except anthropic.APIError as exc:
            failed += 1
            print(f"email {i}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        answered += 1
        _ = "".join(block.text for block in message.content if block.type == "text")
    print(json.dumps({"tasks": TASKS, "answered": answered, "failed": failed}), flush=True)
    return 0  # the job went through every task; what failed is in the summary


if __name__ == "__main__":
    raise SystemExit(main())
