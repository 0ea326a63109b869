"""The reference agent: a small model client that drives the boundary on purpose.

Tests, chaos runs and game days need an agent whose behaviour is known: one
call, a runaway loop, a hammer, a polite client that backs off, a streamed call.
It reads the environment a supervisor gives an agent (flags override it):

  OPENAI_BASE_URL, OPENAI_API_KEY        the boundary's OpenAI door and the per-run token
  ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY  the same, with DOCKET_AGENT_PROVIDER=anthropic
  DOCKET_BOUNDARY_URL                    the boundary's root, where backoff waits are reported
  DOCKET_AGENT_MODE                      once | stream | loop | hammer | backoff (default once)
  DOCKET_AGENT_CALLS                     calls for loop, hammer, backoff (default 10)
  DOCKET_AGENT_CONCURRENCY               hammer's concurrent workers (default 4)
  DOCKET_AGENT_MODEL, DOCKET_AGENT_MAX_TOKENS, DOCKET_AGENT_TIMEOUT (seconds per call)
  DOCKET_AGENT_SEED                      the jitter's random seed (default: drawn, and printed)
  DOCKET_AGENT_BACKOFF_BASE, DOCKET_AGENT_BACKOFF_CAP, DOCKET_AGENT_MAX_ATTEMPTS,
  DOCKET_AGENT_MAX_RETRY_AFTER           the backoff policy (docket.backoff.BackoffPolicy)
  DOCKET_AGENT_BASE_URL                  (or --base-url) instead of the provider's base URL

It ends with one JSON line on stdout (calls, ok, refusals by status, waited
seconds, errors by kind; stream adds ttfb_s, total_s and events). A refusal is
an expected outcome of loop, hammer and backoff, so those exit 0 once they ran;
they exit 1 only if no call got an HTTP answer at all. once and stream exit 1
unless their call succeeded. loop and backoff stop at a docket_policy_denied
refusal (a cap ends a runaway loop); hammer counts refusals and goes on.

SIGTERM or SIGINT (a supervisor stopping the run: a cap kill, a full ledger,
Ctrl-C) stops the agent: it makes no further call, abandons those in flight
(counted as `interrupted`), prints its summary with `"stopped": "sigterm"` (or
"sigint") and exits 128 + the signal (143, 130), as a process killed by it
would: the mode did not finish, and the summary is what it did until then. A
signal that arrives while Python is still starting, before the handler is in
place, kills it without a summary.

The agent deliberately uses raw HTTP, not the provider SDKs: the SDKs retry on
their own, and a reference agent whose retries are hidden cannot be the client
half of a game day. The decisions (what an answer means, how long to back off)
are pure; the trio part only sends, reads and sleeps.
"""

from __future__ import annotations

import json
import secrets
import signal
import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from random import Random
from typing import TextIO

from docket import __version__
from docket.backoff import RETRYABLE_STATUSES, BackoffPolicy, GiveUp, parse_retry_after
from docket.errors import CheckFailed, InputError

MODES = ("once", "stream", "loop", "hammer", "backoff")
STOP_SIGNALS = {signal.SIGTERM: "sigterm", signal.SIGINT: "sigint"}  # -> Tally.stopped
PROVIDERS = ("openai", "anthropic")
DEFAULT_MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-3-5-haiku-20241022"}
ANTHROPIC_VERSION = "2023-06-01"
POLICY_DENIED = "docket_policy_denied"
BACKOFF_ROUTE = "/docket/agent/backoff"
REPORT_TIMEOUT = 5.0  # seconds: a report must not stretch the wait it reports
MAX_SSE_LINE = 1024 * 1024  # a stream that never sends a newline is broken, not long

# The flag that overrides each setting, so an error names what the user typed.
FLAGS = {
    "DOCKET_AGENT_PROVIDER": "--provider",
    "DOCKET_AGENT_MODE": "--mode",
    "DOCKET_AGENT_CALLS": "--calls",
    "DOCKET_AGENT_CONCURRENCY": "--concurrency",
    "DOCKET_AGENT_MODEL": "--model",
    "DOCKET_AGENT_MAX_TOKENS": "--max-tokens",
    "DOCKET_AGENT_TIMEOUT": "--timeout",
    "DOCKET_AGENT_SEED": "--seed",
    "DOCKET_AGENT_BACKOFF_BASE": "--backoff-base",
    "DOCKET_AGENT_BACKOFF_CAP": "--backoff-cap",
    "DOCKET_AGENT_MAX_ATTEMPTS": "--max-attempts",
    "DOCKET_AGENT_MAX_RETRY_AFTER": "--max-retry-after",
    "DOCKET_AGENT_BASE_URL": "--base-url",
}


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class AgentConfig:
    provider: str
    base_url: str
    api_key: str
    boundary_url: str | None
    mode: str
    calls: int
    concurrency: int
    model: str
    max_tokens: int
    timeout: float
    seed: int
    policy: BackoffPolicy

    @property
    def endpoint(self) -> str:
        # The SDKs' conventions: OpenAI's base URL includes /v1, Anthropic's does not.
        root = self.base_url.rstrip("/")
        return root + ("/chat/completions" if self.provider == "openai" else "/v1/messages")

    def auth_headers(self) -> dict[str, str]:
        if self.provider == "openai":
            return {"authorization": f"Bearer {self.api_key}"}
        return {"x-api-key": self.api_key, "anthropic-version": ANTHROPIC_VERSION}


class _Settings:
    """The environment with flag overrides, naming where a bad value came from."""

    def __init__(self, env: Mapping[str, str], overrides: Mapping[str, str | None]):
        self._env = env
        self._overrides = {k: v for k, v in overrides.items() if v is not None}

    def get(self, name: str) -> str | None:
        value = self._overrides.get(name, self._env.get(name))
        return None if value is None or value.strip() == "" else value.strip()

    def where(self, name: str) -> str:
        return FLAGS.get(name, name) if name in self._overrides else name

    def bad(self, name: str, problem: str) -> InputError:
        return InputError(f"agent: {self.where(name)}={self.get(name)!r}: {problem}")

    def positive_int(self, name: str, default: int) -> int:
        text = self.get(name)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            raise self.bad(name, "not a whole number") from None
        if value < 1:
            raise self.bad(name, "must be at least 1")
        return value

    def seconds(self, name: str, default: float) -> float:
        text = self.get(name)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            raise self.bad(name, "not a number of seconds") from None
        if not (value > 0 and value != float("inf")):
            raise self.bad(name, "must be a positive, finite number of seconds")
        return value


def _check_url(settings: _Settings, name: str, url: str) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise settings.bad(name, f"not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise settings.bad(name, "not an http(s) URL with a host")
    return url


def config_from(
    env: Mapping[str, str], overrides: Mapping[str, str | None] | None = None
) -> AgentConfig:
    """Read and check every setting; a bad one is an InputError naming it (exit 2)."""
    s = _Settings(env, overrides or {})
    provider = (s.get("DOCKET_AGENT_PROVIDER") or "openai").lower()
    if provider not in PROVIDERS:
        raise s.bad("DOCKET_AGENT_PROVIDER", f"not one of {', '.join(PROVIDERS)}")
    mode = (s.get("DOCKET_AGENT_MODE") or "once").lower()
    if mode not in MODES:
        raise s.bad("DOCKET_AGENT_MODE", f"not one of {', '.join(MODES)}")

    prefix = provider.upper()
    url_name = "DOCKET_AGENT_BASE_URL" if s.get("DOCKET_AGENT_BASE_URL") else f"{prefix}_BASE_URL"
    base_url = s.get(url_name)
    if base_url is None:
        example = "/openai/v1" if provider == "openai" else "/anthropic"
        raise InputError(
            f"agent: {prefix}_BASE_URL is not set: point it at the boundary"
            f" (http://127.0.0.1:PORT{example}) or pass --base-url"
        )
    base_url = _check_url(s, url_name, base_url)
    api_key = s.get(f"{prefix}_API_KEY")
    if api_key is None:
        raise InputError(
            f"agent: {prefix}_API_KEY is not set (the per-run token the supervisor gives the agent)"
        )
    boundary_url = s.get("DOCKET_BOUNDARY_URL")
    if boundary_url is not None:
        boundary_url = _check_url(s, "DOCKET_BOUNDARY_URL", boundary_url)

    seed_text = s.get("DOCKET_AGENT_SEED")
    if seed_text is None:
        seed = secrets.randbits(32)  # printed in the summary, so the run can be replayed
    else:
        try:
            seed = int(seed_text)
        except ValueError:
            raise s.bad("DOCKET_AGENT_SEED", "not a whole number") from None
    calls = s.positive_int("DOCKET_AGENT_CALLS", 10)  # checked in every mode: bad is bad
    try:
        policy = BackoffPolicy(
            base=s.seconds("DOCKET_AGENT_BACKOFF_BASE", 0.1),
            cap=s.seconds("DOCKET_AGENT_BACKOFF_CAP", 5.0),
            max_attempts=s.positive_int("DOCKET_AGENT_MAX_ATTEMPTS", 8),
            max_hint=s.seconds("DOCKET_AGENT_MAX_RETRY_AFTER", 60.0),
        )
    except ValueError as exc:  # every field is checked above; this is the policy's own word
        raise InputError(f"agent: backoff policy: {exc}") from None
    return AgentConfig(
        provider=provider,
        base_url=base_url,
        api_key=api_key,
        boundary_url=boundary_url,
        mode=mode,
        calls=1 if mode in ("once", "stream") else calls,
        concurrency=s.positive_int("DOCKET_AGENT_CONCURRENCY", 4),
        model=s.get("DOCKET_AGENT_MODEL") or DEFAULT_MODELS[provider],
        max_tokens=s.positive_int("DOCKET_AGENT_MAX_TOKENS", 16),
        timeout=s.seconds("DOCKET_AGENT_TIMEOUT", 60.0),
        seed=seed,
        policy=policy,
    )


# ---------------------------------------------------------------- pure decisions


def request_body(config: AgentConfig, n: int, *, stream: bool) -> dict:
    """The call's JSON body; `n` makes each call of a run distinct (a retry reuses it)."""
    body: dict = {
        "model": config.model,
        "max_tokens": config.max_tokens,
        "messages": [{"role": "user", "content": f"Say hello. This is call {n}."}],
    }
    if stream:
        body["stream"] = True
        if config.provider == "openai":
            body["stream_options"] = {"include_usage": True}
    return body


@dataclass(frozen=True)
class Outcome:
    """What one HTTP attempt came to: ok, refused (an HTTP error answer) or error."""

    kind: str  # "ok" | "refused" | "error"
    status: int | None = None
    error_type: str | None = None  # error.type of a refusal's body, when it has one
    retry_after: str | None = None  # the raw header; parsing is the policy's business
    reason: str | None = None  # why an error is one: "ConnectError", "malformed_body", ...
    detail: str | None = None  # the first line a human needs to see

    @property
    def answered(self) -> bool:
        """The server answered with an HTTP status (the call reached it)."""
        return self.status is not None

    @property
    def policy_denied(self) -> bool:
        return self.kind == "refused" and self.error_type == POLICY_DENIED


def _error_type(body: bytes) -> str | None:
    # OpenAI: {"error": {"type": ...}}; Anthropic: {"type": "error", "error": {"type": ...}}.
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    error = doc.get("error") if isinstance(doc, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    return kind if isinstance(kind, str) else None


def classify(provider: str, status: int, body: bytes, retry_after: str | None) -> Outcome:
    """A complete non-streamed answer: ok only if it is a 2xx with the provider's shape."""
    if status >= 400:
        return Outcome("refused", status, _error_type(body), retry_after)
    if not 200 <= status < 300:
        return Outcome("error", status, reason=f"unexpected_status_{status}")
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return Outcome("error", status, reason="malformed_body", detail="body is not JSON")
    key = "choices" if provider == "openai" else "content"
    if not (isinstance(doc, dict) and isinstance(doc.get(key), list)):
        return Outcome("error", status, reason="malformed_body", detail=f"no {key!r} list")
    return Outcome("ok", status)


class SseDecoder:
    """Server-sent events from bytes as they arrive; knows when a provider's stream is done.

    OpenAI ends a stream with `data: [DONE]`, Anthropic with `event: message_stop`;
    a stream that closes before that was truncated, whatever it carried.
    """

    def __init__(self, provider: str):
        self.provider = provider
        self.events = 0
        self.done = False
        self.error_type: str | None = None
        self._buffer = b""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        if len(self._buffer) > MAX_SSE_LINE:
            raise ValueError(f"an event-stream line longer than {MAX_SSE_LINE} bytes")
        for raw in lines:
            self._line(raw.rstrip(b"\r").decode("utf-8", errors="replace"))

    def _line(self, line: str) -> None:
        if line == "":
            if self._data or self._event:
                self._dispatch(self._event, "\n".join(self._data))
            self._event, self._data = "", []
            return
        if line.startswith(":"):
            return  # a comment (keep-alive)
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)

    def _dispatch(self, event: str, data: str) -> None:
        self.events += 1
        terminal = data == "[DONE]" if self.provider == "openai" else event == "message_stop"
        if terminal:
            self.done = True
        elif event == "error" or '"error"' in data:
            kind = _error_type(data.encode())
            if kind is not None or event == "error":
                self.error_type = self.error_type or kind or "unknown"

    def outcome(self, status: int) -> Outcome:
        """What the stream came to once the connection has closed."""
        if self.error_type is not None:
            return Outcome("error", status, reason="stream_error", detail=self.error_type)
        if not self.done:
            return Outcome(
                "error", status, reason="truncated_stream", detail=f"after {self.events} events"
            )
        return Outcome("ok", status)


@dataclass
class Tally:
    """Running totals for the summary line (the agent keeps no per-call history)."""

    calls: int = 0
    ok: int = 0
    answered: int = 0
    refused: Counter = field(default_factory=Counter)  # by status
    refused_types: Counter = field(default_factory=Counter)  # by error.type
    errors: Counter = field(default_factory=Counter)  # by reason
    first_error: str | None = None
    waited_s: float = 0.0
    retries: int = 0
    gave_up: Counter = field(default_factory=Counter)
    reports: Counter = field(default_factory=Counter)  # "sent" | "failed" | "unreported"
    stopped: str = "done"
    interrupted: int = 0  # calls in flight when a signal stopped the agent

    def record(self, outcome: Outcome) -> None:
        self.calls += 1
        self.answered += outcome.answered
        if outcome.kind == "ok":
            self.ok += 1
        elif outcome.kind == "refused":
            self.refused[str(outcome.status)] += 1
            if outcome.error_type:
                self.refused_types[outcome.error_type] += 1
        else:
            self.errors[outcome.reason or "unknown"] += 1
            if self.first_error is None:
                self.first_error = f"{outcome.reason}: {outcome.detail}"

    def summary(self, config: AgentConfig, elapsed_s: float) -> dict:
        out = {
            "mode": config.mode,
            "provider": config.provider,
            "model": config.model,
            "calls": self.calls,
            "answered": self.answered,
            "ok": self.ok,
            "refused": dict(self.refused),
            "refused_types": dict(self.refused_types),
            "errors": dict(self.errors),
            "waited_s": round(self.waited_s, 6),
            "elapsed_s": round(elapsed_s, 6),
            "stopped": self.stopped,
            "seed": config.seed,
        }
        if self.stopped in STOP_SIGNALS.values():
            out["interrupted"] = self.interrupted
        if self.first_error is not None:
            out["first_error"] = self.first_error
        if config.mode == "backoff":
            out["retries"] = self.retries
            out["gave_up"] = dict(self.gave_up)
            out["reports"] = dict(self.reports)
        if config.mode == "hammer":
            out["concurrency"] = config.concurrency
        return out


# ---------------------------------------------------------------- the trio part


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
        self.in_flight = 0

    def stop(self, signum: int) -> None:
        """A stop signal: the mode is about to be cancelled; the summary says why."""
        if self.tally.stopped not in STOP_SIGNALS.values():
            self.tally.stopped = STOP_SIGNALS[signal.Signals(signum)]
            self.tally.interrupted = self.in_flight

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(f"docket agent: {message}", file=self.err, flush=True)

    async def call(self, n: int, *, stream: bool = False) -> Outcome:
        import httpx

        config = self.config
        body = json.dumps(request_body(config, n, stream=stream)).encode()
        headers = {
            **config.auth_headers(),
            "content-type": "application/json",
            "user-agent": f"docket-agent/{__version__}",
        }
        self.in_flight += 1
        try:
            if stream:
                outcome = await self._stream(body, headers)
            else:
                r = await self.client.post(config.endpoint, content=body, headers=headers)
                outcome = classify(
                    config.provider, r.status_code, r.content, r.headers.get("retry-after")
                )
        except httpx.HTTPError as exc:  # connect, read, timeout, protocol: an outcome, not a crash
            outcome = Outcome("error", reason=type(exc).__name__, detail=str(exc) or repr(exc))
        finally:
            self.in_flight -= 1
        self.tally.record(outcome)
        return outcome

    async def _stream(self, body: bytes, headers: dict[str, str]) -> Outcome:
        import trio

        started = trio.current_time()
        first_byte: float | None = None
        async with self.client.stream(
            "POST", self.config.endpoint, content=body, headers=headers
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
                outcome = await self.call(n)
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


async def run_agent(
    config: AgentConfig, err: TextIO = sys.stderr, *, early_signals: list[int] | None = None
) -> dict:
    """Run the configured mode to its end, or until SIGTERM/SIGINT; return the summary.

    `early_signals` holds stop signals caught before this ran (agent_command
    catches them from its first instant): the agent then stops at once.
    """
    import httpx
    import trio

    timeout = httpx.Timeout(config.timeout, connect=min(config.timeout, 10.0))
    limits = httpx.Limits(max_connections=config.concurrency + 1)  # +1: the backoff reports
    started = trio.current_time()
    # trust_env=False: an HTTP(S)_PROXY meant for the agent's other traffic must not
    # route its model calls somewhere other than the base URL it was given.
    async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
        agent = Agent(config, client, err)
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            async with trio.open_nursery() as nursery:
                if early_signals:
                    agent.stop(early_signals[0])
                    nursery.cancel_scope.cancel()
                nursery.start_soon(_stop_on_signal, agent, signals, nursery.cancel_scope)
                await getattr(agent, config.mode)()
                nursery.cancel_scope.cancel()  # the mode is done: stop listening
    summary = agent.tally.summary(config, trio.current_time() - started)
    summary.update(agent.stream_timing)
    return summary


async def _stop_on_signal(agent: Agent, signals, mode_scope) -> None:
    async for signum in signals:
        agent.stop(signum)
        mode_scope.cancel()
        return


def verdict(config: AgentConfig, summary: dict) -> str | None:
    """Why the run did not do what its mode says, or None when it did."""
    if config.mode in ("once", "stream"):
        if summary["ok"] == 1:
            return None
        if summary["refused"]:
            (status,) = summary["refused"]
            kinds = ", ".join(summary["refused_types"]) or "no error type"
            return f"the call was refused: HTTP {status} ({kinds})"
        return f"the call failed: {summary.get('first_error')}"
    # A refusal is what loop, hammer and backoff exist to meet; never reaching
    # the server at all is not (a wrong port, a boundary that is not up).
    if summary["calls"] and not summary["answered"]:
        return f"no call got an HTTP answer ({summary.get('first_error')})"
    return None


def agent_command(overrides: Mapping[str, str | None], env: Mapping[str, str] | None = None) -> int:
    """`docket agent`: run, print the summary line, and exit by the mode's verdict."""
    # Caught from here on, so a stop that comes while the agent starts still
    # gets its summary; run_agent's signal receiver takes over from these.
    early: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _: early.append(signum)) for sig in STOP_SIGNALS
    }
    import os

    import trio

    try:
        config = config_from(os.environ if env is None else env, overrides)
        summary = trio.run(partial(run_agent, config, early_signals=early))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print(json.dumps(summary), flush=True)
    if summary["stopped"] in STOP_SIGNALS.values():
        stopped_by = next(s for s, name in STOP_SIGNALS.items() if name == summary["stopped"])
        return 128 + stopped_by
    problem = verdict(config, summary)
    if problem is not None:
        raise CheckFailed(f"agent: {problem}")
    return 0
