"""A batch job on the openai SDK, non-streaming: one chat completion per task.

Written the way most are: `openai.OpenAI()` reads OPENAI_BASE_URL and OPENAI_API_KEY,
the SDK's own retries are left at their default (max_retries=2, honouring
Retry-After), and a task that still fails is logged and skipped. The task count
is DOCKET_AGENT_CALLS (a game day's hint; 10 otherwise). Exits 0 once every task
was tried (the failures are in its summary line).
"""

from __future__ import annotations

import json
import os
import sys

import openai

TASKS = int(os.environ.get("DOCKET_AGENT_CALLS", "10"))
TIMEOUT = float(os.environ.get("DOCKET_AGENT_TIMEOUT", "10"))
MAX_TOKENS = int(os.environ.get("DOCKET_AGENT_MAX_TOKENS", "32"))


def main() -> int:
    client = openai.OpenAI(timeout=TIMEOUT)
    answered = failed = 0
    for i in range(TASKS):
        try:
            reply = client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[
                    {"role": "system", "content": "Answer in one short sentence."},
                    {"role": "user", "content": f"Summarise ticket #{1000 + i}."},
                ],
                max_tokens=MAX_TOKENS,
            )
        except openai.APIError as exc:
            failed += 1
            print(f"task {i}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        answered += 1
        _ = reply.choices[0].message.content
    print(json.dumps({"tasks": TASKS, "answered": answered, "failed": failed}), flush=True)
    return 0  # the job went through every task; what failed is in the summary


if __name__ == "__main__":
    raise SystemExit(main())
