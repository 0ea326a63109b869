"""A chat backend on the openai SDK that streams every answer (`stream=True`).

No `stream_options`: the team never asked for usage in the stream. Each answer is
read chunk by chunk and joined, as a UI would show it. The SDK's retries are at
their default (they cover the request, not a stream that breaks halfway); a
failed answer is logged and the next task goes on: every failure is an
`openai.APIError`, a stream cut halfway included (the SDK raises it as
APIConnectionError). Tasks: DOCKET_AGENT_CALLS (10 otherwise). Exits 0 once every
task was tried (the failures are in its summary line).
"""

from __future__ import annotations

import json
import os
import sys

import openai

TASKS = int(os.environ.get("DOCKET_AGENT_CALLS", "10"))
TIMEOUT = float(os.environ.get("DOCKET_AGENT_TIMEOUT", "10"))
MAX_TOKENS = int(os.environ.get("DOCKET_AGENT_MAX_TOKENS", "32"))


def answer(client: openai.OpenAI, i: int) -> str:
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": f"Draft a reply to message {i}."}],
        max_tokens=MAX_TOKENS,
        stream=True,
    )
    parts = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def main() -> int:
    client = openai.OpenAI(timeout=TIMEOUT)
    answered = failed = 0
    for i in range(TASKS):
        try:
            answer(client, i)
        except openai.APIError as exc:
            failed += 1
            print(f"message {i}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        answered += 1
    print(json.dumps({"tasks": TASKS, "answered": answered, "failed": failed}), flush=True)
    return 0  # the job went through every task; what failed is in the summary


if __name__ == "__main__":
    raise SystemExit(main())
