"""A plain-HTTP agent (httpx, no SDK) with a careful retry loop of its own.

What the resilience guides say to write: retry only what may succeed later (408,
429, 5xx, a broken connection), at most four attempts per call, capped exponential
backoff with full jitter, and an answer's Retry-After as a floor under the next
request, whichever call makes it; a 403 (a spend cap's denial) is final, so the
job stops there. Reads OPENAI_BASE_URL and OPENAI_API_KEY; tasks:
DOCKET_AGENT_CALLS (10 otherwise). Exits 0 once the job is done or stopped (its
summary line says what failed).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import httpx

BASE_URL = os.environ["OPENAI_BASE_URL"].rstrip("/")
KEY = os.environ["OPENAI_API_KEY"]
TASKS = int(os.environ.get("DOCKET_AGENT_CALLS", "10"))
TIMEOUT = float(os.environ.get("DOCKET_AGENT_TIMEOUT", "10"))
MAX_TOKENS = int(os.environ.get("DOCKET_AGENT_MAX_TOKENS", "32"))
ATTEMPTS = 4
BASE_S, CAP_S = 0.05, 2.0
RETRYABLE = {408, 429, 500, 502, 503, 504}


class Stop(Exception):
    """An answer no retry can change (a cap's 403, a bad request)."""


class Client:
    """httpx with a retry loop, and the server's last Retry-After kept for every call."""

    def __init__(self) -> None:
        headers = {"authorization": f"Bearer {KEY}"}
        self.http = httpx.Client(base_url=BASE_URL, headers=headers, timeout=TIMEOUT)
        self.not_before = 0.0  # time.monotonic() before which no request goes out

    def post(self, path: str, body: dict) -> httpx.Response:
        time.sleep(max(0.0, self.not_before - time.monotonic()))
        response = self.http.post(path, json=body)
        try:
            wait = float(response.headers.get("retry-after", "0"))
        except ValueError:
            wait = 0.0  # an HTTP date: our own backoff decides
        self.not_before = max(self.not_before, time.monotonic() + wait)
        return response

    def complete(self, prompt: str) -> dict:
        body = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": MAX_TOKENS,
        }
        for attempt in range(ATTEMPTS):
            try:
                response = self.post("/chat/completions", body)
            except httpx.TransportError as exc:
                problem = type(exc).__name__
            else:
                if response.status_code == 200:
                    return response.json()
                if response.status_code not in RETRYABLE:
                    raise Stop(f"{response.status_code} {response.text[:200]}")
                problem = f"status {response.status_code}"
            if attempt + 1 == ATTEMPTS:
                raise RuntimeError(f"{problem} after {ATTEMPTS} attempts")
            time.sleep(random.uniform(0, min(CAP_S, BASE_S * 2**attempt)))
        raise AssertionError("not reached")


def main() -> int:
    answered = failed = 0
    client = Client()
    with client.http:
        for i in range(TASKS):
            try:
                client.complete(f"Extract the invoice total from document {i}.")
            except Stop as exc:
                failed += 1
                print(f"document {i}: stopping the job: {exc}", file=sys.stderr, flush=True)
                break
            except RuntimeError as exc:
                failed += 1
                print(f"document {i}: {exc}", file=sys.stderr, flush=True)
                continue
            answered += 1
    print(json.dumps({"tasks": TASKS, "answered": answered, "failed": failed}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
