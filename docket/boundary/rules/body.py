"""body: its size and framing.                        413/400 docket_bad_request"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from docket.boundary.calls import CallFacts, Fact
from docket.boundary.rules.base import Refusal, Rule, denied
from docket.http.server_errors import BodyTooLarge, RequestError

if TYPE_CHECKING:
    from docket.boundary.calls import Admitting
    from docket.boundary.ports import AdmissionHost

MAX_REQUEST_BYTES = 32 << 20


@dataclass(frozen=True)
class BodyProblem:
    """The body could not be read: over the size limit, or broken framing."""

    too_large: bool
    message: str
    code: str  # the HTTP layer's name for the fault (body_too_large, bad_chunk...)
    status: int  # the HTTP layer's status for it (413, 400, 408)


FACT: Fact[bytes | BodyProblem] = Fact("body")


def check(body: bytes | BodyProblem, f: CallFacts) -> Refusal | None:
    if not isinstance(body, BodyProblem):
        return None
    if body.too_large:
        return denied(f, "max_request_bytes", "docket_bad_request", body.message, close=True)
    # A body that breaks HTTP's framing or stops arriving: the client's fault, refused
    # like any bad request (never an internal error).
    return denied(
        f,
        "bad_request",
        "docket_bad_request",
        body.message,
        extra={"code": body.code},
        close=True,
        status=body.status,
    )


async def learn(host: AdmissionHost, call: Admitting) -> None:
    limit = MAX_REQUEST_BYTES
    try:
        host.probe("request.read")
        call.facts[FACT] = await call.request.read_body(limit=limit)
    except BodyTooLarge as exc:
        call.facts[FACT] = BodyProblem(
            True, f"request body over {limit} bytes", exc.code, exc.status
        )
    except RequestError as exc:
        # A chunk size not in hex, a chunk longer than its size, a body that stops
        # arriving. Nothing was reserved or forwarded.
        call.facts[FACT] = BodyProblem(False, host.scrub(str(exc)), exc.code, exc.status)


RULE = Rule("body", FACT, check, learn)
