"""request: the body parses as the provider's call.    400 docket_bad_request"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from docket.boundary import providers
from docket.boundary.calls import CallFacts, Fact
from docket.boundary.providers import RequestFacts
from docket.boundary.rules import body
from docket.boundary.rules.base import Refusal, Rule, denied

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost


@dataclass(frozen=True)
class Unparsed:
    """The body is not the provider's request (providers.BadRequest), texts scrubbed."""

    message: str
    param: str | None = None
    code: str | None = None


FACT: Fact[RequestFacts | Unparsed] = Fact("request")


def check(request: RequestFacts | Unparsed, f: CallFacts) -> Refusal | None:
    if not isinstance(request, Unparsed):
        return None
    extra = {k: v for k, v in (("param", request.param), ("code", request.code)) if v is not None}
    return denied(f, "bad_request", "docket_bad_request", request.message, extra=extra or None)


async def learn(host: AdmissionHost, call: Admitting) -> None:
    data = call.facts[body.FACT]
    assert isinstance(data, bytes)  # the body rule let the call through
    request = call.request
    try:
        parsed = providers.request_facts(
            call.route.provider, "/" + call.facts.path, request.headers, data, method=request.method
        )
    except providers.BadRequest as exc:
        # Scrubbed: the message may quote the body (a member's name or value).
        call.facts[FACT] = Unparsed(
            host.scrub(str(exc)),
            None if exc.param is None else host.scrub(exc.param),
            None if exc.code is None else host.scrub(exc.code),
        )
        return
    call.facts[FACT] = parsed
    call.facts.model = parsed.model


RULE = Rule("request", FACT, check, learn)
