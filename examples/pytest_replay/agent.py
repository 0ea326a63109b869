"""A small agent for the pytest plugin's example: questions to a model through the
openai SDK, unchanged. Its client is made per call, after docket's fixture has pointed
OPENAI_BASE_URL at the replay (or, recording, at the boundary in front of the provider)."""

from __future__ import annotations

import openai

PROMPT = "Greet {name} in five words."


def greet(name: str) -> str:
    client = openai.OpenAI(max_retries=0, timeout=20)
    done = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": PROMPT.format(name=name)}],
        max_tokens=8,
    )
    return done.choices[0].message.content or ""


def greet_all(names: list[str]) -> dict[str, str]:
    return {name: greet(name) for name in names}
