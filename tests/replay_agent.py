"""An agent for tests/test_replay.py: the openai and anthropic SDKs, unchanged, each
asked once whole and once streamed, through the base URLs `docket run` gives it.

Prints one JSON line: what each answer said (the text, joined from a stream's
deltas), or for a call the SDK refused, its exception's class and module.
REPLAY_AGENT_QUESTION changes the second question (a changed agent);
REPLAY_AGENT_RETRIES sets both SDKs' max_retries (default 0).
"""

from __future__ import annotations

import json
import os

import anthropic
import openai

QUESTION = os.environ.get("REPLAY_AGENT_QUESTION", "and the second?")
out: dict[str, object] = {}


def attempt(name, fn):
    try:
        out[name] = fn()
    except (openai.APIError, anthropic.APIError) as exc:
        out[name] = {"raised": type(exc).__name__, "module": type(exc).__module__}


RETRIES = int(os.environ.get("REPLAY_AGENT_RETRIES", "0"))
oa = openai.OpenAI(max_retries=RETRIES, timeout=20)
an = anthropic.Anthropic(max_retries=RETRIES, timeout=20)
first = [{"role": "user", "content": "sixteen bytes!!!"}]
second = [{"role": "user", "content": QUESTION}]


def openai_whole():
    done = oa.chat.completions.create(model="gpt-4o-mini", messages=first, max_tokens=5)
    return done.choices[0].message.content


def openai_stream():
    chunks = oa.chat.completions.create(
        model="gpt-4o-mini", messages=second, max_tokens=4, stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def anthropic_whole():
    done = an.messages.create(model="claude-haiku-4-5", max_tokens=5, messages=first)
    return done.content[0].text


def anthropic_stream():
    with an.messages.stream(model="claude-haiku-4-5", max_tokens=3, messages=second) as s:
        return "".join(s.text_stream)


attempt("openai", openai_whole)
attempt("openai_stream", openai_stream)
attempt("anthropic", anthropic_whole)
attempt("anthropic_stream", anthropic_stream)
print(json.dumps(out, sort_keys=True), flush=True)
