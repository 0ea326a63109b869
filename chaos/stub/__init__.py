"""Stub model providers: OpenAI- and Anthropic-shaped, deterministic, with a request log.

`Stub(StubConfig(kind=...))` serves under a trio nursery; `docket stub` runs one
from the command line. The wire shapes live in openai.py (chat completions, models)
with openai_extra.py (the Responses API, whole and streamed, and embeddings), and in
anthropic.py (messages, models).
"""
