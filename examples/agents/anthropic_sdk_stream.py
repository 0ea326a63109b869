"""An assistant on the anthropic SDK that streams every answer (`client.messages.stream`).

The text is read as it comes (`stream.text_stream`), then the final message (with
its usage) is taken from the stream. SDK retries at their default; a failed answer
is logged and the next one goes on, written like the openai one next to it:
`except anthropic.APIError`. But this SDK lets a stream cut halfway through as the
transport's own exception (httpx's RemoteProtocolError), not an APIError: the
program ends there with a traceback, which a game day's cut stream shows
(handles_cut_stream, runs_to_the_end). Tasks: DOCKET_AGENT_CALLS (10 otherwise).
Exits 0 once every task was tried (the failures are in its summary line).
"""

from __future__ import annotations

import json
import os
import sys

import anthropic

TASKS = int(os.environ.get("DOCKET_AGENT_CALLS", "10"))
TIMEOUT = float(os.environ.get("DOCKET_AGENT_TIMEOUT", "10"))
MAX_TOKENS = int(os.environ.get("DOCKET_AGENT_MAX_TOKENS", "32"))


def answer(client: anthropic.Anthropic, i: int) -> str:
    with client.messages.stream(
        model="claude-3-5-haiku-latest",
        max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": f"Explain step {i} of the runbook."}],
    ) as stream:
        text = "".join(stream.text_stream)
        stream.get_final_message()
    return text


def main() -> int:
    client = anthropic.Anthropic(timeout=TIMEOUT)
    answered = failed = 0
    for i in range(TASKS):
        try:
            answer(client, i)
        except anthropic.APIError as exc:
            failed += 1
            print(f"step {i}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            continue
        answered += 1
    print(json.dumps({"tasks": TASKS, "answered": answered, "failed": failed}), flush=True)
    return 0  # the job went through every task; what failed is in the summary


if __name__ == "__main__":
    raise SystemExit(main())
