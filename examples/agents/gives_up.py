"""A script that gives up at its first error: `raise_for_status()` and exit 1.

Plain httpx, no retries of any kind: the first answer that is not a 2xx (or a
connection that breaks) ends the run with exit 1 and one line on stderr. Many
cron jobs and notebooks are this. Reads OPENAI_BASE_URL and OPENAI_API_KEY;
tasks: DOCKET_AGENT_CALLS (10 otherwise).
"""

from __future__ import annotations

import os
import sys

import httpx

BASE_URL = os.environ["OPENAI_BASE_URL"].rstrip("/")
KEY = os.environ["OPENAI_API_KEY"]
TASKS = int(os.environ.get("DOCKET_AGENT_CALLS", "10"))
TIMEOUT = float(os.environ.get("DOCKET_AGENT_TIMEOUT", "10"))
MAX_TOKENS = int(os.environ.get("DOCKET_AGENT_MAX_TOKENS", "32"))


def main() -> int:
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=BASE_URL, headers=headers, timeout=TIMEOUT) as http:
        for i in range(TASKS):
            body = {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": f"Translate line {i} to French."}],
                "max_tokens": MAX_TOKENS,
            }
            try:
                http.post("/chat/completions", json=body).raise_for_status()
            except httpx.HTTPError as exc:
                print(f"line {i}: {exc}; giving up", file=sys.stderr, flush=True)
                return 1
    print(f"translated {TASKS} lines", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
