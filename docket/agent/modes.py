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
from docket.agent.backoff import GiveUp, parse_retry_after, retryable
from docket.agent.budget import RetryBudget
from docket.agent.calls import POLICY_DENIED, Outcome, SseDecoder, classify, request_body
from docket.agent.config import AgentConfig
from docket.agent.report import STOP_SIGNALS, Tally

BACKOFF_ROUTE = "/docket/agent/backoff"
DEADLINE_HEADER = "x-docket-deadline-ms"
MAX_DEADLINE_MS = 86_400_000  # the boundary refuses more (docket.guards.deadline)
REPORT_TIMEOUT = 5.0  # seconds: a report must not stretch the wait it reports


class Agent:
    """Sends the calls a mode asks for; every outcome goes to the tally."""

    def __init__(self, config: AgentConfig, client, err: TextIO):
        self.config = config
        self.client = client  # httpx.AsyncClient
        self.err = err
        self.tally = Tally()
        self.budget = RetryBudget(config.retry_ratio, config.retry_floor)
        self.tally.budget = self.budget
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

    async def call(
        self, n: int, *, stream: bool = False, attempt: int = 0, left_s: float | None = None
    ) -> Outcome:
        """One attempt of call n; with `left_s` (the call's time left before its deadline)
        the boundary is told it, and the attempt's own timeout is cut to it."""
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
        timeout = config.timeout
        if left_s is not None:
            headers[DEADLINE_HEADER] = str(min(max(int(left_s * 1000), 0), MAX_DEADLINE_MS))
            timeout = max(min(timeout, left_s), 0.001)
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
                    config.endpoint,
                    content=body,
                    headers=headers,
                    extensions=extensions,
                    timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
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

    async def report_backoff(
        self, attempt: int, wait_s: float, hint: float | None, status: int | None
    ):
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
        """Each call retried on what is retryable (docket.agent.backoff.retryable), within
        its deadline and the run's retry budget; every wait reported, then slept."""
        import trio

        policy = self.config.policy
        for n in range(self.config.calls):
            deadline = trio.current_time() + self.config.deadline
            attempt = 0
            self.budget.deposit()
            while True:
                outcome = await self.call(n, attempt=attempt, left_s=deadline - trio.current_time())
                if outcome.policy_denied:
                    self.tally.stopped = POLICY_DENIED
                    return
                if not retryable(outcome.kind, outcome.status, outcome.reason):
                    break
                hint = parse_retry_after(outcome.retry_after)
                decision = policy.decide(attempt, hint, self.rng, deadline - trio.current_time())
                if not isinstance(decision, GiveUp) and not self.budget.allows():
                    self.budget.withdraw()  # refused: counted as such
                    decision = GiveUp("retry_budget")
                if isinstance(decision, GiveUp):
                    self.tally.gave_up[decision.reason] += 1
                    break
                await self.report_backoff(attempt + 1, decision.seconds, hint, outcome.status)
                # the report took time too: the sleep is cut to what is left of the deadline
                slept_from = trio.current_time()
                wake = min(slept_from + decision.seconds, deadline)
                await trio.sleep_until(wake)
                self.tally.waited_s += wake - slept_from
                if trio.current_time() >= deadline:
                    self.tally.gave_up["deadline"] += 1
                    break
                self.budget.withdraw()  # allowed above, and nothing has spent since
                self.tally.retries += 1
                attempt += 1
