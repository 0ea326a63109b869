"""The trio part of the reference agent: it sends the calls a mode asks for, reads, sleeps.

An Agent holds one httpx client (made by docket.agent.command.run_agent) and a Tally.
Each mode (once, stream, loop, hammer, backoff, repeat) is a method; every attempt
becomes an Outcome decided by docket.agent.calls and recorded in the tally, and
the backoff mode asks docket.agent.backoff's pure policy how long to wait, reports the
wait to the boundary, then sleeps it. Cancellation (a stop signal) comes from
outside, through the nursery that runs the mode.
"""

from __future__ import annotations

import json
import signal
from random import Random
from typing import TextIO

from docket import __version__
from docket.agent.backoff import RETRYABLE_STATUSES, GiveUp, parse_retry_after
from docket.agent.calls import POLICY_DENIED, Outcome, SseDecoder, classify, request_body
from docket.agent.config import AgentConfig
from docket.agent.report import STOP_SIGNALS, Tally

BACKOFF_ROUTE = "/docket/agent/backoff"
REPORT_TIMEOUT = 5.0  # seconds: a report must not stretch the wait it reports


class Agent:
    """Sends the calls a mode asks for; every outcome goes to the tally."""

    def __init__(self, config: AgentConfig, client, err: TextIO):
        self.config = config
        self.client = client  # httpx.AsyncClient
        self.err = err
        self.tally = Tally()
        self.rng = Random(config.seed)
        self.stream_timing: dict[str, float | int] = {}
        self._warned: set[str] = set()
        self._route_missing = False
        # Calls begun and not settled, and among them those whose request has left in
        # full: only those can be in the boundary's ledger. A call stopped while its
        # request was still being written never reached it (counted as `unsent`).
        self.in_flight = 0
        self.sent_in_flight = 0

    def stop(self, signum: int) -> None:
        """A stop signal: the mode is about to be cancelled; the summary says why."""
        if self.tally.stopped not in STOP_SIGNALS.values():
            self.tally.stopped = STOP_SIGNALS[signal.Signals(signum)]
            self.tally.interrupted = self.sent_in_flight
            self.tally.unsent = self.in_flight - self.sent_in_flight

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(f"docket agent: {message}", file=self.err, flush=True)

    async def call(self, n: int, *, stream: bool = False, attempt: int = 0) -> Outcome:
        import httpx

        config = self.config
        body = json.dumps(request_body(config, n, stream=stream)).encode()
        headers = {
            **config.auth_headers(),
            "content-type": "application/json",
            "user-agent": f"docket-agent/{__version__}",
            # Which try of call n this is, in the header the openai and anthropic SDKs
            # use: the ledger tells its retries from new calls (docs/clients.md).
            "x-stainless-retry-count": str(attempt),
        }
        sent = False

        async def trace(event: str, info: dict) -> None:
            # httpcore's trace: the request's last byte is on the wire
            nonlocal sent
            if event == "http11.send_request_body.complete" and not sent:
                sent = True
                self.sent_in_flight += 1

        extensions = {"trace": trace}
        self.in_flight += 1
        try:
            if stream:
                outcome = await self._stream(body, headers, extensions)
            else:
                r = await self.client.post(
                    config.endpoint, content=body, headers=headers, extensions=extensions
                )
                outcome = classify(
                    config.provider, r.status_code, r.content, r.headers.get("retry-after")
                )
        except httpx.HTTPError as exc:  # connect, read, timeout, protocol: an outcome, not a crash
            outcome = Outcome("error", reason=type(exc).__name__, detail=str(exc) or repr(exc))
        finally:
            self.in_flight -= 1
            self.sent_in_flight -= sent
        self.tally.record(outcome)
        return outcome

    async def _stream(self, body: bytes, headers: dict[str, str], extensions: dict) -> Outcome:
        import trio

        started = trio.current_time()
        first_byte: float | None = None
        async with self.client.stream(
            "POST", self.config.endpoint, content=body, headers=headers, extensions=extensions
        ) as r:
            if r.status_code >= 300:
                data = await r.aread()
                return classify(
                    self.config.provider, r.status_code, data, r.headers.get("retry-after")
                )
            decoder = SseDecoder(self.config.provider)
            try:
                async for chunk in r.aiter_bytes():
                    if first_byte is None:
                        first_byte = trio.current_time()
                    decoder.feed(chunk)
            except ValueError as exc:
                return Outcome("error", r.status_code, reason="malformed_stream", detail=str(exc))
        finished = trio.current_time()
        self.stream_timing = {
            "ttfb_s": round((first_byte or finished) - started, 6),
            "total_s": round(finished - started, 6),
            "events": decoder.events,
        }
        return decoder.outcome(r.status_code)

    async def report_backoff(self, attempt: int, wait_s: float, hint: float | None, status: int):
        """Tell the boundary about a wait before taking it (it records agent.backoff)."""
        import httpx

        if self.config.boundary_url is None:
            self.tally.reports["unreported"] += 1
            self.warn_once(
                "no_boundary", "DOCKET_BOUNDARY_URL is not set; backoff waits go unreported"
            )
            return
        if self._route_missing:
            self.tally.reports["unreported"] += 1
            return
        url = self.config.boundary_url.rstrip("/") + BACKOFF_ROUTE
        payload = {"attempt": attempt, "wait_s": wait_s, "retry_after": hint, "status": status}
        try:
            r = await self.client.post(
                url,
                json=payload,
                headers=self.config.auth_headers(),
                timeout=min(self.config.timeout, REPORT_TIMEOUT),
            )
        except httpx.HTTPError as exc:
            self.tally.reports["failed"] += 1
            self.warn_once(f"report:{type(exc).__name__}", f"backoff report to {url} failed: {exc}")
            return
        if r.status_code == 404:
            self.tally.reports["failed"] += 1
            self._route_missing = True  # an older boundary: it will not grow the route mid-run
            self.warn_once(
                "route_missing",
                f"{url} answered 404 (no backoff route); further waits go unreported",
            )
        elif r.status_code >= 300:
            self.tally.reports["failed"] += 1
            self.warn_once(f"report:{r.status_code}", f"backoff report to {url}: {r.status_code}")
        else:
            self.tally.reports["sent"] += 1

    # -- modes

    async def once(self) -> None:
        await self.call(0)

    async def stream(self) -> None:
        await self.call(0, stream=True)

    async def loop(self) -> None:
        for n in range(self.config.calls):
            if (await self.call(n)).policy_denied:
                self.tally.stopped = POLICY_DENIED
                return

    async def repeat(self) -> None:
        """A loop stuck on one question: call 0's body, byte for byte, `calls` times.
        With --temperature 0 these are the identical greedy calls a [cache] may serve."""
        for _ in range(self.config.calls):
            if (await self.call(0)).policy_denied:
                self.tally.stopped = POLICY_DENIED
                return

    async def hammer(self) -> None:
        import trio

        next_call = 0

        async def worker() -> None:
            nonlocal next_call
            while next_call < self.config.calls:
                n, next_call = next_call, next_call + 1
                await self.call(n)

        async with trio.open_nursery() as nursery:
            for _ in range(min(self.config.concurrency, self.config.calls)):
                nursery.start_soon(worker)

    async def backoff(self) -> None:
        import trio

        policy = self.config.policy
        for n in range(self.config.calls):
            attempt = 0
            while True:
                outcome = await self.call(n, attempt=attempt)
                if outcome.policy_denied:
                    self.tally.stopped = POLICY_DENIED
                    return
                if outcome.kind != "refused" or outcome.status not in RETRYABLE_STATUSES:
                    break
                hint = parse_retry_after(outcome.retry_after)
                decision = policy.decide(attempt, hint, self.rng)
                if isinstance(decision, GiveUp):
                    self.tally.gave_up[decision.reason] += 1
                    break
                await self.report_backoff(attempt + 1, decision.seconds, hint, outcome.status)
                await trio.sleep(decision.seconds)
                self.tally.waited_s += decision.seconds
                self.tally.retries += 1
                attempt += 1
