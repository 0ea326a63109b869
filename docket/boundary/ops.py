"""The boundary's own endpoints, `/docket/...`: liveness, readiness, metrics, and the
reference agent's backoff reports.

    GET  /docket/healthz        200 while the process serves
    GET  /docket/readyz         503 naming each problem: a breaker not closed, accept()
                                failing, the ledger incomplete, full or short of disk
    GET  /docket/metrics        Prometheus text (docket/boundary/metrics.py)
    POST /docket/agent/backoff  an agent's backoff, recorded as agent.backoff (the run's
                                token required)

None of them is a model call: nothing here is admitted, reserved or forwarded.
"""

from __future__ import annotations

import json
import math
import os

from docket.boundary import providers
from docket.boundary.forward import closing_bound
from docket.boundary.ports import OpsHost
from docket.http.server_exchange import Request, Responder
from docket.ledger.limits import EvidenceLost, LedgerFull

MAX_REPORTED = 2**53 - 1  # the largest integer an agent's report may carry (exact in JSON)


class OpsEndpoints:
    """`/docket/...`, served for one boundary."""

    __slots__ = ("host",)

    def __init__(self, host: OpsHost) -> None:
        self.host = host

    async def serve(self, request: Request, respond: Responder, path: str) -> None:
        if path == "/docket/healthz":
            await _json(respond, 200, {"status": "alive"})
        elif path == "/docket/readyz":
            problems = self.readiness_problems()
            await _json(
                respond, 503 if problems else 200, {"ready": not problems, "problems": problems}
            )
        elif path == "/docket/metrics":
            body = self.host.metrics.render(self.host).encode()
            await respond.simple(200, [(b"content-type", b"text/plain; version=0.0.4")], body)
        elif path == "/docket/agent/backoff" and request.method == "POST":
            await self.agent_backoff(request, respond)
        else:
            await _json(respond, 404, {"error": f"no such endpoint {path}"})

    def readiness_problems(self) -> list[str]:
        """What makes the boundary unready: each breaker that is not closed (the
        provider is the problem), then the ledger (the evidence path is)."""
        problems = self.host.guards.ready_problems()
        if self.host.server_stats is not None and self.host.server_stats.accept_failing is not None:
            problems.append(f"accepting connections: {self.host.server_stats.accept_failing}")
        stats = self.host.recorder.ledger.stats
        if not stats.ledger_complete:
            problems.append(
                f"ledger: {stats.unwritten_events} events unwritten since seq {stats.first_failing_seq}"
            )
        try:
            vfs = os.statvfs(os.path.dirname(os.path.abspath(self.host.recorder.ledger.path)))
            free = vfs.f_bavail * vfs.f_frsize
            if free < self.host.policy.ledger.min_free_bytes:
                problems.append(
                    f"ledger volume: {free} bytes free, below min_free_bytes "
                    f"{self.host.policy.ledger.min_free_bytes}"
                )
        except OSError as exc:
            problems.append(f"ledger volume: cannot stat ({exc.strerror})")
        short = self.host.recorder.ledger.reserve_problem
        if short is not None:
            problems.append(f"ledger volume: the disk reserve cannot be kept ({short})")
        try:
            self.host.recorder.ledger.check_room(
                "model.request", 512, closing_bytes=closing_bound("", "", None)
            )
        except (LedgerFull, EvidenceLost) as exc:
            problems.append(f"ledger: {exc}")
        return problems

    async def agent_backoff(self, request: Request, respond: Responder) -> None:
        if not providers.token_matches(providers.presented_token(request.headers), self.host.token):
            await _json(respond, 401, {"error": "the run's token is required"})
            return
        try:
            fields = backoff_fields(await request.read_body(limit=4096))
        except ValueError as exc:
            await _json(respond, 400, {"error": f"bad backoff report: {exc}"})
            return
        try:
            await self.host.recorder.record("agent.backoff", **fields)
        except LedgerFull as full:
            await _json(respond, 503, {"error": str(full)})
            return
        except EvidenceLost:
            await _json(respond, 503, {"error": "the ledger could not be written"})
            return
        await _json(respond, 200, {"recorded": True})


def backoff_fields(body: bytes) -> dict[str, object]:
    """An agent's backoff report ({"attempt", "wait_s", "retry_after"?, "status"?}) as
    event fields; ValueError naming what is wrong. Only finite, non-negative numbers
    are taken: the ledger's JSON has no NaN, and a negative wait is not a wait."""
    try:
        report = json.loads(body)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(report, dict):
        raise ValueError("expected a JSON object")

    def number(name: str, *, required: bool, integer: bool = False) -> int | float | None:
        value = report.get(name)
        if value is None:
            if required:
                raise ValueError(f'"{name}" is required')
            return None
        if type(value) is int:
            ok = 0 <= value <= MAX_REPORTED
        else:
            ok = not integer and type(value) is float and math.isfinite(value) and value >= 0
        if not ok:
            kind = "a whole number" if integer else "a number"
            raise ValueError(f'"{name}" must be {kind} >= 0, got {value!r}')
        return value if integer else float(value)

    status = number("status", required=False, integer=True)
    if status is not None and not 100 <= status <= 599:
        raise ValueError(f'"status" must be an HTTP status, got {status}')
    return {
        "attempt": number("attempt", required=True, integer=True),
        "wait_s": number("wait_s", required=True),
        "retry_after": number("retry_after", required=False),
        "status": status,
    }


async def _json(respond: Responder, status: int, obj: dict[str, object]) -> None:
    body = json.dumps(obj).encode()
    await respond.simple(status, [(b"content-type", b"application/json")], body)
