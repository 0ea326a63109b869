"""Calls to a provider that are not model calls: listing its models, relayed and recorded.

An agent that lists the models at start (`client.models.list()`, `models.retrieve`)
must get the provider's answer, not a refusal. Only those reads are relayed: an
allowlist, so any other path that is not a model call (uploads, fine-tuning, batch
files) stays refused as before. They cost nothing, so they hold no reservation,
pass no cap, and count in no receipt total; each is one `provider.call` event
(the ledger's vocabulary in docket/ledger/chain.py, extended: a type of its own, because a model.request
would count as a model call), written when the answer is known and before it is
relayed, with the status (or the transport failure's reason), the bytes, the
duration and the client's own marks. The provider's key goes upstream as for a
model call and is scrubbed out of the answer.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from docket.boundary import admission, providers
from docket.boundary.forward import error_reason, relay_headers
from docket.boundary.ports import IntakeHost
from docket.boundary.providers import Provider
from docket.boundary.providers.client_marks import client_marks
from docket.boundary.routes import Route
from docket.boundary.rules.base import Refusal
from docket.guards.redact import sanitize_url
from docket.guards.scrub import Scrubber
from docket.http import client as upstream
from docket.http.server_exchange import Request, Responder
from docket.ledger.limits import EvidenceLost, LedgerFull

EVENT = "provider.call"
Refuse = Callable[[Responder, Provider, Refusal], Awaitable[None]]  # Intake.answer_refusal
# GET /v1/models and GET /v1/models/{id}: the same paths on OpenAI and Anthropic.
_MODELS = re.compile(r"/v1/models(/[A-Za-z0-9._:@-]{1,128})?/?")
MAX_ANSWER_BYTES = 4 << 20  # a model list is kilobytes; more is not a model list


def non_model_endpoint(method: str, path: str) -> str | None:
    """The name of a relayed non-model call ("models.list", "models.retrieve"), or None:
    the request is not one (it is refused as "not a model call")."""
    if method != "GET":
        return None
    match = _MODELS.fullmatch(path)
    if match is None:
        return None
    return "models.retrieve" if match.group(1) else "models.list"


async def relay_non_model(
    boundary: IntakeHost,
    route: Route,
    rest: str,
    request: Request,
    respond: Responder,
    endpoint: str,
    refuse: Refuse,
) -> None:
    """Forward one non-model call (its token already checked) and record it. An answer
    the ledger could not take is not relayed: the client gets the refusal a model
    call would get (docket_ledger_full, docket_evidence_lost) from `refuse`
    (Intake.answer_refusal) instead."""
    target = route.target(rest, request.query)
    fields: dict[str, object] = {
        "provider": route.name,
        "endpoint": endpoint,
        "method": request.method,
        "url": sanitize_url(target),
        **client_marks(request.headers, boundary.scrub).as_fields(),
    }
    headers = providers.upstream_headers(
        route.provider,
        request.headers,
        api_key=route.api_key,
        upstream_host=route.host_header,
        content_length=None,
    )
    scrub = Scrubber(boundary.relay_keys)
    started = boundary.clock.mono()
    try:
        async with route.pool.request(
            "GET", target, headers, b"", wait_timeout=route.pool.connect_timeout
        ) as resp:
            data = await resp.read(limit=MAX_ANSWER_BYTES)
            status, answer_headers = resp.status, relay_headers(resp.headers)
    except upstream.UpstreamError as exc:
        reason = error_reason(exc)
        fields |= {"reason": reason, "detail": str(exc)[:300]}
        if await _recorded(boundary, route, respond, fields, started, refuse):
            kind = (
                "docket_upstream_timeout" if reason == "timeout" else "docket_upstream_unreachable"
            )
            answer = providers.refusal(
                route.provider, kind, f"upstream {route.name}: {reason}: {exc}"
            )
            await respond.simple(answer.status, answer.headers, answer.body)
        return
    answered = fields | {"status": status, "bytes": len(data)}
    if await _recorded(boundary, route, respond, answered, started, refuse):
        await respond.simple(status, scrub.headers(answer_headers), scrub.whole(data))


async def _recorded(
    boundary: IntakeHost,
    route: Route,
    respond: Responder,
    fields: dict[str, object],
    started: float,
    refuse: Refuse,
) -> bool:
    """Write the provider.call event; False (the client answered with a refusal) if
    the ledger could not take it (the recorder has asked the run to stop)."""
    fields["duration_ms"] = max(0, round((boundary.clock.mono() - started) * 1000))
    try:
        await boundary.recorder.record(EVENT, **fields)
        return True
    except LedgerFull as full:
        refusal = admission.ledger_full(route.name, None, full.reason, str(full))
    except EvidenceLost:
        refusal = admission.evidence_lost(route.name, None)
    await refuse(respond, route.provider, refusal)
    return False
