"""A fan-out of 8: asyncio and the async openai SDK, eight calls in flight at once.

Tasks (DOCKET_AGENT_CALLS, 16 otherwise) are answered by `asyncio.gather` under a
semaphore of 8, the number the team picked (DOCKET_AGENT_CONCURRENCY is not
read). SDK retries at their default; a failed task is logged and the rest go on.
Exits 0 once every task was tried (its summary line says what failed).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import openai

TASKS = int(os.environ.get("DOCKET_AGENT_CALLS", "16"))
TIMEOUT = float(os.environ.get("DOCKET_AGENT_TIMEOUT", "10"))
MAX_TOKENS = int(os.environ.get("DOCKET_AGENT_MAX_TOKENS", "32"))
FAN_OUT = 8


async def one(client: openai.AsyncOpenAI, gate: asyncio.Semaphore, i: int) -> bool:
    async with gate:
        try:
            await client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": f"Tag product {i} with three keywords."}],
                max_tokens=MAX_TOKENS,
            )
        except openai.APIError as exc:
            print(f"product {i}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return False
    return True


async def main() -> int:
    gate = asyncio.Semaphore(FAN_OUT)
    async with openai.AsyncOpenAI(timeout=TIMEOUT) as client:
        results = await asyncio.gather(*(one(client, gate, i) for i in range(TASKS)))
    answered = sum(results)
    print(json.dumps({"tasks": TASKS, "answered": answered, "failed": TASKS - answered}))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
