"""endpoint: a model call this boundary records.      400 docket_bad_request

Reads the parsed request (the request rule's fact): it has no learner of its own."""

from __future__ import annotations

from docket.boundary.calls import CallFacts
from docket.boundary.providers import RequestFacts
from docket.boundary.rules import request
from docket.boundary.rules.base import Refusal, Rule, denied


def check(parsed: RequestFacts | request.Unparsed, f: CallFacts) -> Refusal | None:
    if not isinstance(parsed, RequestFacts):
        return None  # refused by the request rule, ahead of this one
    if parsed.endpoint != "other" and parsed.model is not None:
        return None
    message = f"{f.method} /{f.path} is not a model call this boundary records"
    return denied(f, "endpoint", "docket_bad_request", message, own_model=False)


RULE = Rule("endpoint", request.FACT, check, None)
