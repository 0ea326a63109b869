"""An agent that retries on its own clock: a fixed 50 ms pause, whatever the answer says.

Plain HTTP (httpx, no SDK): on any answer but 200 it tries again after 50 ms, up
to five attempts, never reading Retry-After, never telling a 403 from a 503. Under
a rate limit or an open breaker every retry comes back sooner than the boundary
asked, and is refused again. `docket game-day --agent-command "python
examples/ignores_retry_after_agent.py"` shows it as findings (honours_retry_after,
backs_off_with_jitter, max_attempts, no_retry_on_cap_denial) while the boundary
checks still pass: the boundary holds whatever the agent does.

Reads OPENAI_BASE_URL and OPENAI_API_KEY (the boundary's route and the run token,
as `docket run` gives them) and DOCKET_AGENT_CALLS, DOCKET_AGENT_CONCURRENCY,
DOCKET_AGENT_TIMEOUT, DOCKET_AGENT_MAX_TOKENS. Prints one JSON line at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx

BASE_URL = os.environ["OPENAI_BASE_URL"].rstrip("/")
KEY = os.environ.get("OPENAI_API_KEY", "")
CALLS = int(os.environ.get("DOCKET_AGENT_CALLS", "5"))
CONCURRENCY = int(os.environ.get("DOCKET_AGENT_CONCURRENCY", "1"))
TIMEOUT = float(os.environ.get("DOCKET_AGENT_TIMEOUT", "10"))
MAX_TOKENS = int(os.environ.get("DOCKET_AGENT_MAX_TOKENS", "16"))
ATTEMPTS = 5
PAUSE_S = 0.05  # the same pause every time: no backoff, no jitter, no Retry-After


def ask(http: httpx.Client, i: int) -> str:
    outcome = "no attempt"
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": f"question {i}: what is {i} + {i}?"}],
        "max_tokens": MAX_TOKENS,
    }
    for _ in range(ATTEMPTS):
        try:
            answer = http.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:
            outcome = type(exc).__name__
        else:
            if answer.status_code == 200:
                return "ok"
            outcome = f"status {answer.status_code}"
        time.sleep(PAUSE_S)
    return outcome


def main() -> int:
    headers = {"authorization": f"Bearer {KEY}"}
    with (
        httpx.Client(base_url=BASE_URL, headers=headers, timeout=TIMEOUT) as http,
        ThreadPoolExecutor(max_workers=CONCURRENCY) as pool,
    ):
        outcomes = Counter(pool.map(lambda i: ask(http, i), range(CALLS)))
    print(json.dumps({"calls": CALLS, "outcomes": dict(outcomes)}), flush=True)
    print(f"ignores_retry_after_agent: {outcomes['ok']} of {CALLS} calls answered", file=sys.stderr)
    return 0 if outcomes["ok"] == CALLS else 1


if __name__ == "__main__":
    raise SystemExit(main())
