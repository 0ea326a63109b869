"""A hammer: retries at once, as often as it may, and never reads Retry-After.

Plain httpx from four threads; any answer but 200 (a 429, a 503, a 403) is tried
again immediately, up to ten times, then the task is dropped. Written by someone
who met a flaky endpoint once. Reads OPENAI_BASE_URL and OPENAI_API_KEY; tasks:
DOCKET_AGENT_CALLS (10 otherwise). Exits 0 once every task was tried (its
summary line says how many were dropped).
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx

BASE_URL = os.environ["OPENAI_BASE_URL"].rstrip("/")
KEY = os.environ["OPENAI_API_KEY"]
TASKS = int(os.environ.get("DOCKET_AGENT_CALLS", "10"))
TIMEOUT = float(os.environ.get("DOCKET_AGENT_TIMEOUT", "10"))
MAX_TOKENS = int(os.environ.get("DOCKET_AGENT_MAX_TOKENS", "32"))
THREADS = 4
TRIES = 10


def task(http: httpx.Client, i: int) -> bool:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": f"Score lead {i} from 1 to 10."}],
        "max_tokens": MAX_TOKENS,
    }
    last = "no answer"
    for _ in range(TRIES):
        try:
            response = http.post("/chat/completions", json=body)
        except httpx.TransportError as exc:
            last = type(exc).__name__
            continue
        if response.status_code == 200:
            return True
        last = f"status {response.status_code}"
    print(f"lead {i}: dropped after {TRIES} tries ({last})", file=sys.stderr, flush=True)
    return False


def main() -> int:
    headers = {"authorization": f"Bearer {KEY}"}
    with (
        httpx.Client(base_url=BASE_URL, headers=headers, timeout=TIMEOUT) as http,
        ThreadPoolExecutor(max_workers=THREADS) as pool,
    ):
        results = list(pool.map(lambda i: task(http, i), range(TASKS)))
    answered = sum(results)
    print(json.dumps({"tasks": TASKS, "answered": answered, "dropped": TASKS - answered}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
