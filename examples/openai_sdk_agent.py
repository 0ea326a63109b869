"""An agent written against the openai SDK the way many are: two retry layers.

The SDK retries on its own (max_retries=2 by default: three attempts per request,
on 408, 409, 429 and 5xx, honouring Retry-After), and the application wraps each
call in a retry loop of its own (three tries on any APIError, a fixed pause).
Under a failing provider the layers multiply: up to nine attempts for one call,
and a 403 (a spend cap's denial) is retried too. `docket game-day --agent-command
"python examples/openai_sdk_agent.py"` shows it as findings (max_attempts,
no_retry_on_cap_denial) while the boundary checks still pass.

Reads what `docket run` gives any agent: OPENAI_BASE_URL and OPENAI_API_KEY (the
boundary's route and the run token), and the phase's workload:
DOCKET_AGENT_CALLS, DOCKET_AGENT_CONCURRENCY, DOCKET_AGENT_TIMEOUT,
DOCKET_AGENT_MAX_TOKENS. Prints one JSON line at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import openai

CALLS = int(os.environ.get("DOCKET_AGENT_CALLS", "5"))
CONCURRENCY = int(os.environ.get("DOCKET_AGENT_CONCURRENCY", "1"))
TIMEOUT = float(os.environ.get("DOCKET_AGENT_TIMEOUT", "10"))
MAX_TOKENS = int(os.environ.get("DOCKET_AGENT_MAX_TOKENS", "16"))
APP_TRIES = 3  # the application's own retry loop, on top of the SDK's
APP_PAUSE_S = 0.2

client = openai.OpenAI(timeout=TIMEOUT)  # max_retries: the SDK's default (2)


def ask(i: int) -> str:
    """One logical call: the question i, retried by the app and, inside, by the SDK."""
    outcome = "no attempt"
    for _ in range(APP_TRIES):
        try:
            client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": f"question {i}: what is {i} + {i}?"}],
                max_tokens=MAX_TOKENS,
            )
            return "ok"
        except openai.APIStatusError as exc:
            outcome = f"status {exc.status_code}"
        except openai.APIError as exc:
            outcome = type(exc).__name__
        time.sleep(APP_PAUSE_S)
    return outcome


def main() -> int:
    with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
        outcomes = Counter(pool.map(ask, range(CALLS)))
    print(json.dumps({"calls": CALLS, "outcomes": dict(outcomes)}), flush=True)
    print(f"openai_sdk_agent: {outcomes['ok']} of {CALLS} calls answered", file=sys.stderr)
    return 0 if outcomes["ok"] == CALLS else 1


if __name__ == "__main__":
    raise SystemExit(main())
