"""Findings about the team's own agent, read from the ledger of a game-day run.

Boundary checks (the phase's `expect:`) say what Docket guarantees whatever the
agent does. These say how the agent behaved: whether it honoured Retry-After,
backed off with jitter, stopped after a cap denial, kept its attempts per call
bounded, survived a cut stream, and exited on SIGTERM within the grace period.
Each is a pure function of the run's ledger events (and, for the exit, the
agent's own exit status): a `Finding` that is `ok`, a `finding` with its
evidence (seqs, waits) and one line of advice from the resilience patterns
(docs/resilience.md), or `not_shown` when the run never put the agent in that
situation (which says so, and is never a pass).

An attempt is a call as the boundary met it (chaos.gameday.derive.ATTEMPTS): a
forwarded `model.request` (with its closing event) or a refusal. Attempts are
the agent's when their provider route is one of the agent's; a phase lets a user
agent replace only agents whose routes no other calling agent shares
(chaos.gameday.your_agent), so the attribution is exact.

Attempts are grouped into logical calls: by `client_attempt` on model.request
and on refusals (the SDK's x-stainless-retry-count, recorded by the boundary) when
present, a retry counted k joining its body's call, or else a call that has had k
attempts (calls in flight together, their refusals bodiless, stay apart); else
by the request body's digest (a retry resends the same body) and order (a refusal
carries no digest, so it joins the latest call whose last attempt failed).
The inference is named in the evidence.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from chaos.gameday.derive import ATTEMPTS
from docket.agent.budget import DEFAULT_FLOOR, DEFAULT_RATIO, allowance

OK = "ok"
FINDING = "finding"
NOT_SHOWN = "not_shown"
VERDICTS = (OK, FINDING, NOT_SHOWN)

RETRY_AFTER_SLACK_S = 0.05  # the ledger stamps each end of a wait within a few ms
IMMEDIATE_S = 0.01  # a retry sooner than this after a failure did not back off at all
CUT_REASONS = ("reset", "stream_cut", "truncated")  # a closing model.error for a cut stream
SIGKILL_STATUS = 128 + 9
SIGTERM_STATUS = 128 + 15


@dataclass(frozen=True)
class Finding:
    """One agent check's result on one run."""

    check: str  # the check's name, as the phase file declares it
    verdict: str  # ok | finding | not_shown
    summary: str  # one line: what was observed
    evidence: tuple[str, ...] = ()  # lines naming seqs and waits
    seqs: tuple[tuple[int, int], ...] = ()  # the seq ranges the evidence is in
    advice: str = ""  # one line, for a finding

    def to_json(self) -> dict:
        return {
            "check": self.check,
            "title": TITLES.get(self.check, self.check),
            "verdict": self.verdict,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "seqs": [list(r) for r in self.seqs],
            "advice": self.advice,
        }

    @classmethod
    def from_json(cls, data: Mapping) -> Finding:
        return cls(
            check=str(data["check"]),
            verdict=str(data["verdict"]),
            summary=str(data.get("summary", "")),
            evidence=tuple(data.get("evidence", ())),
            seqs=tuple((int(a), int(b)) for a, b in data.get("seqs", ())),
            advice=str(data.get("advice", "")),
        )


TITLES = {
    "honours_retry_after": "honours Retry-After",
    "backs_off_with_jitter": "backs off with jitter",
    "no_retry_on_cap_denial": "does not retry a 403 cap denial",
    "max_attempts": "bounded attempts per logical call",
    "handles_cut_stream": "handles a cut stream",
    "exits_on_sigterm": "exits within the grace period on SIGTERM",
    "runs_to_the_end": "does its work to the end (no give-up, no crash)",
}

ADVICE = {
    "honours_retry_after": "Wait at least the Retry-After the answer gives (as a floor under "
    "your own backoff); a retry before it is refused again and spends the limit.",
    "backs_off_with_jitter": "Use capped exponential backoff with full jitter "
    "(sleep = random(0, min(cap, base * 2**attempt))) so clients do not retry in step.",
    "no_retry_on_cap_denial": "A 403 cap denial is final for the run: stop (or escalate) "
    "instead of retrying; retry only 408, 429 and 5xx.",
    "max_attempts": "Keep one retry layer: the SDK's (max_retries) or your own loop, not both, "
    "and a retry budget across calls, so an outage is not multiplied into a storm.",
    "handles_cut_stream": "Treat a stream that ends without its final event as a failed call: "
    "retry it once (or report it) and carry on, never crash or hang.",
    "exits_on_sigterm": "Handle SIGTERM: stop starting calls, flush, and exit well inside the "
    "grace period, before SIGKILL takes the chance away.",
    "runs_to_the_end": "Treat a failed call as a result, not the end of the job: retry what "
    "is retryable (408, 429, 5xx, a cut stream) a bounded number of times, report the rest "
    "and carry on; install the SDK and read the key your agent needs from the environment.",
}


# ---------------------------------------------------------------- attempts and calls


@dataclass
class Attempt:
    """One call as the boundary met it, with how it ended as the agent learned it."""

    seq: int
    mono_ms: float  # when it reached the boundary
    type: str  # model.request or a refusal's event type
    provider: str
    sha: str | None = None  # the request body's digest (forwarded calls only)
    client_attempt: int | None = None  # x-stainless-retry-count, when the boundary recorded it
    end_ms: float | None = None  # when its answer was decided (closing event, or the refusal)
    end_seq: int | None = None
    status: int | None = None
    ok: bool = False
    hint_s: float | None = None  # the Retry-After the answer carried, in seconds
    cap: str | None = None  # a cap denial names its cap
    reason: str | None = None  # a model.error's reason


@dataclass
class LogicalCall:
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def sha(self) -> str | None:
        return next((a.sha for a in self.attempts if a.sha is not None), None)

    @property
    def certain(self) -> int:
        """Attempts known to be this call's: up to its last forwarded one (a refusal
        carries no body digest, so refusals after it joined by order alone, and may be
        the next call's first tries)."""
        marked = [i for i, a in enumerate(self.attempts) if a.sha is not None]
        return marked[-1] + 1 if marked else 1

    @property
    def failed_last(self) -> bool:
        return bool(self.attempts) and not self.attempts[-1].ok


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def hint_seconds(value: object) -> float | None:
    """A Retry-After as seconds: a number, or a header value in whole or decimal seconds
    (an HTTP date is not read: a clock ahead of the provider's would make it negative)."""
    number = _num(value)
    if number is not None:
        return number if number >= 0 else None
    if isinstance(value, str):
        try:
            seconds = float(value.strip())
        except ValueError:
            return None
        return seconds if seconds >= 0 and seconds == seconds else None
    return None


def attempts_of(events: Sequence[Mapping], providers: Iterable[str]) -> list[Attempt]:
    """The agent's attempts in the ledger's order, each with its outcome."""
    routes = set(providers)
    out: list[Attempt] = []
    open_calls: dict[object, Attempt] = {}
    for e in events:
        kind = e.get("type")
        provider = e.get("provider") or e.get("upstream")
        seq, mono = e.get("seq"), _num(e.get("mono_ms"))
        if not isinstance(seq, int) or mono is None:
            continue
        if kind in ATTEMPTS and provider in routes:
            attempt = Attempt(seq=seq, mono_ms=mono, type=str(kind), provider=str(provider))
            # The SDK's attempt marker is on refusals too: a refused first try (0) starts a
            # new call, not a retry of the one before it.
            ca = e.get("client_attempt")
            attempt.client_attempt = ca if isinstance(ca, int) and ca >= 0 else None
            if kind == "model.request":
                sha = e.get("request_sha256")
                attempt.sha = sha if isinstance(sha, str) else None
                open_calls[e.get("call_id")] = attempt
            else:  # a refusal: decided at once
                attempt.end_ms, attempt.end_seq = mono, seq
                attempt.hint_s = hint_seconds(e.get("retry_after_s"))
                status = e.get("status")
                attempt.status = status if isinstance(status, int) else None
                # A cap's denial (403), not its deferral (429 docket_caps_pending: the
                # call fits once the calls in flight settle, so retrying it is right).
                if (
                    kind == "policy.denied"
                    and (e.get("cap") or str(e.get("rule", "")).startswith("caps."))
                    and e.get("would_fit_after_settle") is not True
                ):
                    attempt.cap = str(e.get("cap") or e.get("rule"))
            out.append(attempt)
        elif kind in ("model.response", "model.error"):
            if e.get("call_id") not in open_calls:
                continue
            attempt = open_calls.pop(e.get("call_id"))
            attempt.end_ms, attempt.end_seq = mono, seq
            status = e.get("status")
            attempt.status = status if isinstance(status, int) else None
            attempt.ok = kind == "model.response" and (attempt.status in (None, 200))
            attempt.hint_s = hint_seconds(e.get("retry_after"))
            reason = e.get("reason")
            attempt.reason = reason if isinstance(reason, str) else None
    return out


def logical_calls(attempts: Sequence[Attempt]) -> tuple[list[LogicalCall], str]:
    """Attempts grouped into the calls the agent meant to make, and how they were grouped."""
    exact = any(a.client_attempt is not None for a in attempts)
    calls: list[LogicalCall] = []

    def latest_failed(sha: str | None, tries: int | None = None) -> LogicalCall | None:
        """The latest call whose last attempt failed (and whose body can be `sha`). With
        `tries` (a retry's count: how many attempts its SDK call had), calls in flight
        together are told apart when a refusal carries no body digest (eight at once,
        each refused): the body first, then a call with exactly that many attempts,
        one whose body is unknown too before one whose body is known."""
        failed = [c for c in reversed(calls)
                  if c.failed_last and (sha is None or c.sha in (None, sha))]  # fmt: skip
        if tries is None:
            return failed[0] if failed else None
        exact = [c for c in failed if len(c.attempts) == tries]
        order: tuple[list[LogicalCall], ...]
        if sha is not None:
            order = (
                [c for c in exact if c.sha == sha],
                [c for c in failed if c.sha == sha],
                [c for c in exact if c.sha is None],
                exact,
            )
        else:
            order = ([c for c in exact if c.sha is None], exact)
        for group in order:
            if group:
                return group[0]
        return failed[0] if failed else None

    for a in attempts:
        target: LogicalCall | None = None
        if a.client_attempt is not None:
            if a.client_attempt > 0:  # the client's own retry of its failed call
                target = latest_failed(a.sha, a.client_attempt)
                if target is not None and target.sha is None and a.sha is not None:
                    # A refused first try (no body digest) and now its retry: the body says
                    # whether the app was resending an earlier failed call's body.
                    earlier = next(
                        (c for c in reversed(calls)
                         if c is not target and c.sha == a.sha and c.failed_last),
                        None,
                    )  # fmt: skip
                    if earlier is not None:
                        earlier.attempts.extend(target.attempts)
                        calls.remove(target)
                        target = earlier
            elif a.sha is not None:  # a first try: new, unless the app resends a failed body
                target = next(
                    (c for c in reversed(calls) if c.sha == a.sha and c.failed_last), None
                )
        elif a.sha is not None:
            target = next(
                (c for c in reversed(calls) if c.sha == a.sha and c.failed_last), None
            ) or next((c for c in reversed(calls) if c.sha is None and c.failed_last), None)
        else:
            target = latest_failed(None)
        if target is None:
            target = LogicalCall()
            calls.append(target)
        target.attempts.append(a)
    how = (
        "grouped by the client's retry count (x-stainless-retry-count)"
        if exact
        else "grouped by request body and order (inferred: a retry resends the same body)"
    )
    return calls, how


def _ranges(seqs: Iterable[tuple[int, int]], limit: int = 5) -> tuple[tuple[int, int], ...]:
    return tuple(list(seqs)[:limit])


def _s(seconds: float) -> str:
    return f"{seconds:.3f} s"


# ---------------------------------------------------------------- the checks


def honours_retry_after(
    events: Sequence[Mapping], providers: Iterable[str], *, slack_s: float = RETRY_AFTER_SLACK_S
) -> Finding:
    """After an answer with a Retry-After, the agent's next attempt came no sooner."""
    name = "honours_retry_after"
    attempts = attempts_of(events, providers)
    # (the hinted answer's seq, its hint, the next attempt's seq, the wait before it)
    hinted: list[tuple[int, float, int, float]] = []
    for a, b in zip(attempts, attempts[1:], strict=False):
        if a.hint_s is not None and a.hint_s > 0 and a.end_ms is not None:
            hinted.append((a.end_seq or a.seq, a.hint_s, b.seq, (b.mono_ms - a.end_ms) / 1000))
    if not hinted:
        return Finding(name, NOT_SHOWN, "no answer with a Retry-After was followed by a call")
    early = [h for h in hinted if h[3] + slack_s < h[1]]
    lines = tuple(
        f"seq {a} -> {b}: next call after {_s(wait)}, Retry-After {_s(hint)}"
        for a, hint, b, wait in (early or hinted)[:5]
    )
    seqs = _ranges((a, b) for a, _, b, _ in (early or hinted))
    if early:
        return Finding(
            name,
            FINDING,
            f"{len(early)} of {len(hinted)} calls after a Retry-After came sooner than it said",
            lines,
            seqs,
            ADVICE[name],
        )
    return Finding(
        name, OK, f"all {len(hinted)} calls after a Retry-After waited for it", lines, seqs
    )


def retry_waits(
    calls: Sequence[LogicalCall],
) -> list[tuple[int, float, Attempt, Attempt]]:
    """(retry number, seconds waited, failed attempt, retry) for retries after a failure
    that gave no Retry-After (a hinted wait is the server's, not the agent's backoff)."""
    out = []
    for call in calls:
        for n, (a, b) in enumerate(zip(call.attempts, call.attempts[1:], strict=False), 1):
            if a.ok or a.end_ms is None or (a.hint_s is not None and a.hint_s > 0):
                continue
            out.append((n, (b.mono_ms - a.end_ms) / 1000, a, b))
    return out


def backs_off_with_jitter(events: Sequence[Mapping], providers: Iterable[str]) -> Finding:
    """Retries after an unhinted failure waited, and not the same time every time."""
    name = "backs_off_with_jitter"
    calls, how = logical_calls(attempts_of(events, providers))
    waits = retry_waits(calls)
    if not waits:
        return Finding(name, NOT_SHOWN, "no retry after a failure without Retry-After")
    shown = tuple(
        f"retry {n} at seq {b.seq}: {_s(w)} after the failure at seq {a.end_seq}"
        for n, w, a, b in waits[:6]
    ) + (how,)
    seqs = _ranges((a.end_seq or a.seq, b.seq) for _, _, a, b in waits)
    immediate = [(n, w, a, b) for n, w, a, b in waits if w < IMMEDIATE_S]
    # Full jitter draws each wait from [0, cap): now and then one lands under 10 ms by
    # chance (1 of 4 did for examples/agents/httpx_retry.py). An agent that does not back
    # off retries at once most of the time: a finding when at least half came at once.
    if immediate and 2 * len(immediate) >= len(waits):
        return Finding(
            name,
            FINDING,
            f"{len(immediate)} of {len(waits)} retries came at once (under "
            f"{IMMEDIATE_S * 1000:g} ms after the failure)",
            shown,
            _ranges((a.end_seq or a.seq, b.seq) for _, _, a, b in immediate),
            ADVICE[name],
        )
    pooled = [w for _, w, _, _ in waits]
    if len(pooled) >= MIN_SAMPLES and _in_step(pooled, FIXED_NOISE_S, 0.1):
        return Finding(
            name,
            FINDING,
            f"every one of {len(pooled)} retries waited {min(pooled):.3f}-{max(pooled):.3f} s: "
            "a fixed delay, no backoff and no jitter",
            shown, seqs, ADVICE[name],
        )  # fmt: skip
    by_number: dict[int, list[float]] = {}
    for n, w, _, _ in waits:
        by_number.setdefault(n, []).append(w)
    comparable = {n: ws for n, ws in by_number.items() if len(ws) >= MIN_SAMPLES}
    spread = ", ".join(
        f"retry {n}: {min(ws):.3f}-{max(ws):.3f} s over {len(ws)}"
        for n, ws in sorted(by_number.items())
    )
    if comparable and all(_in_step(ws, 0.005, 0.05) for ws in comparable.values()):
        return Finding(
            name, FINDING, f"every retry of the same number waited the same time ({spread})",
            shown, seqs, ADVICE[name],
        )  # fmt: skip
    if len(pooled) < 2:
        return Finding(name, NOT_SHOWN, f"one retry ({spread}): too few to judge", shown, seqs)
    return Finding(name, OK, f"retries waited, and not in step ({spread})", shown, seqs)


MIN_SAMPLES = 3  # waits compared to call them "the same": fewer say little
FIXED_NOISE_S = 0.02  # a fixed pause, as the ledger sees it, varies by scheduling this much


def _in_step(waits: Sequence[float], noise_s: float, share: float) -> bool:
    """All within the noise (or a share of their median) of each other."""
    return max(waits) - min(waits) < max(noise_s, share * statistics.median(waits))


def no_retry_on_cap_denial(events: Sequence[Mapping], providers: Iterable[str]) -> Finding:
    """After a cap denied a call (403 docket_policy_denied), the agent stopped calling
    into it: no later attempt was denied by a cap again."""
    name = "no_retry_on_cap_denial"
    attempts = attempts_of(events, providers)
    first = next((i for i, a in enumerate(attempts) if a.cap is not None), None)
    if first is None:
        return Finding(name, NOT_SHOWN, "no cap denied a call of the agent")
    denial = attempts[first]
    again = [a for a in attempts[first + 1 :] if a.cap is not None]
    later = attempts[first + 1 :]
    if not again:
        what = f"{len(later)} later attempts, none denied" if later else "no later attempt"
        return Finding(
            name, OK, f"the cap denied seq {denial.seq} ({denial.cap}); {what}",
            seqs=((denial.seq, denial.seq),),
        )  # fmt: skip
    span = (again[0].seq, again[-1].seq)
    return Finding(
        name,
        FINDING,
        f"after the cap denial at seq {denial.seq} ({denial.cap}) the agent called "
        f"{len(later)} more times, {len(again)} denied again",
        (
            f"seq {denial.seq}: denied by {denial.cap}",
            f"seq {span[0]}..{span[1]}: {len(again)} more attempts denied by a cap",
        ),
        ((denial.seq, denial.seq), span),
        ADVICE[name],
    )


def max_attempts(events: Sequence[Mapping], providers: Iterable[str], *, at_most: int) -> Finding:
    """No logical call took more than `at_most` attempts (the first included)."""
    name = "max_attempts"
    calls, how = logical_calls(attempts_of(events, providers))
    if not calls:
        return Finding(name, NOT_SHOWN, "the agent made no call")
    over = [c for c in calls if c.certain > at_most]
    worst = max(calls, key=lambda c: (c.certain, len(c.attempts)))

    def line(c: LogicalCall) -> str:
        forwarded = sum(1 for a in c.attempts if a.type == "model.request")
        inferred = len(c.attempts) - c.certain
        return (
            f"seq {c.attempts[0].seq}..{c.attempts[-1].seq}: {c.certain} attempts "
            f"({forwarded} forwarded, {c.certain - forwarded} refused)"
            + (f", and {inferred} refusals after it by order alone" if inferred else "")
        )

    if over:
        over.sort(key=lambda c: -c.certain)
        return Finding(
            name,
            FINDING,
            f"{len(over)} of {len(calls)} calls took more than {at_most} attempts "
            f"(at most {worst.certain})",
            (*(line(c) for c in over[:5]), how),
            _ranges((c.attempts[0].seq, c.attempts[-1].seq) for c in over),
            ADVICE[name],
        )
    return Finding(
        name, OK, f"{len(calls)} calls, at most {worst.certain} attempts each "
        f"(limit {at_most})", (line(worst), how),
        ((worst.attempts[0].seq, worst.attempts[-1].seq),),
    )  # fmt: skip


def handles_cut_stream(
    events: Sequence[Mapping], providers: Iterable[str], *, exit_status: int | None
) -> Finding:
    """After a stream was cut mid-answer, the agent went on (another call) or exited 0."""
    name = "handles_cut_stream"
    attempts = attempts_of(events, providers)
    cut = next(
        (
            i
            for i, a in enumerate(attempts)
            if a.type == "model.request" and a.reason in CUT_REASONS
        ),
        None,
    )
    if cut is None:
        return Finding(name, NOT_SHOWN, "no stream of the agent was cut (it may not stream)")
    a = attempts[cut]
    after = attempts[cut + 1 :]
    if after:
        return Finding(
            name, OK, f"the cut at seq {a.end_seq} was followed by the call at seq {after[0].seq}",
            seqs=((a.seq, after[0].seq),),
        )  # fmt: skip
    if exit_status == 0:
        return Finding(name, OK, f"the cut at seq {a.end_seq} was its last call, and it exited 0")
    return Finding(
        name,
        FINDING,
        f"after the cut stream at seq {a.end_seq} the agent made no call and exited "
        f"{'(status unknown)' if exit_status is None else f'with status {exit_status}'}",
        (f"seq {a.seq}..{a.end_seq}: the stream closed as model.error reason {a.reason}",),
        ((a.seq, a.end_seq or a.seq),),
        ADVICE[name],
    )


def exits_on_sigterm(
    events: Sequence[Mapping], *, grace_s: float, exit_status: int | None
) -> Finding:
    """The run's SIGTERM was followed by the agents' exit within the grace period, not
    by the SIGKILL that ends it. `exit_status` is the agent's own (128 + N for a signal)."""
    name = "exits_on_sigterm"
    term = next(
        (e for e in events if e.get("type") == "signal.forwarded" and e.get("signal") == "SIGTERM"),
        None,
    )
    if term is None:
        return Finding(name, NOT_SHOWN, "the run never sent SIGTERM")
    t0 = _num(term.get("mono_ms")) or 0.0
    seq0 = int(term.get("seq", 0))
    killed = next(
        (
            e
            for e in events
            if e.get("type") == "signal.forwarded"
            and e.get("signal") == "SIGKILL"
            and _num(e.get("mono_ms")) is not None
        ),
        None,
    )
    ended = next(
        (e for e in events if e.get("type") == "process.exit" and int(e.get("seq", -1)) > seq0),
        None,
    )
    took = None if ended is None else ((_num(ended.get("mono_ms")) or t0) - t0) / 1000
    evidence = [f"seq {seq0}: SIGTERM ({term.get('reason', '')})"]
    if ended is not None:
        evidence.append(f"seq {ended.get('seq')}: exit {ended.get('status')} after {_s(took or 0)}")
    if exit_status is not None:
        evidence.append(f"the agent's own exit status: {exit_status}")
    last = int(ended.get("seq", seq0)) if ended is not None else seq0
    if exit_status is not None and exit_status != SIGKILL_STATUS and killed is not None:
        # The run's SIGKILL reached the whole group; this agent had exited already
        # (its own status, not 137): another process of the run outlived the grace.
        return Finding(
            name, OK,
            f"exited with status {exit_status} before the run's SIGKILL (which was for "
            "another of the run's processes)",
            tuple(evidence), ((seq0, last),),
        )  # fmt: skip
    if killed is not None or exit_status == SIGKILL_STATUS or (took is not None and took > grace_s):
        return Finding(
            name,
            FINDING,
            f"the agent was still running {grace_s:g} s after SIGTERM and was killed"
            if killed is not None or exit_status == SIGKILL_STATUS
            else f"the agent took {_s(took or 0)} to exit after SIGTERM (grace {grace_s:g} s)",
            tuple(evidence),
            ((seq0, last),),
            ADVICE[name],
        )
    if ended is None:
        return Finding(name, NOT_SHOWN, "no exit recorded after SIGTERM", tuple(evidence))
    return Finding(
        name, OK, f"exited {_s(took or 0)} after SIGTERM (grace {grace_s:g} s)",
        tuple(evidence), ((seq0, last),),
    )  # fmt: skip


def runs_to_the_end(
    events: Sequence[Mapping],
    providers: Iterable[str],
    *,
    exit_status: int | None,
    last_stderr: str = "",
) -> Finding:
    """Whether the agent did its work to the end: a finding when it exited non-zero by
    itself (gave up at an error, crashed, or never started: a missing module, a key it
    did not find), naming its exit status, the call it stopped at and its last stderr
    line; ok when it exited 0, or was stopped by the run (its SIGTERM, a cap's kill)."""
    name = "runs_to_the_end"
    attempts = attempts_of(events, providers)
    said = f": {last_stderr[:200]}" if last_stderr else ""
    if exit_status is None:
        return Finding(name, NOT_SHOWN, "its exit status was not written (the run was killed)")
    if exit_status == 0:
        return Finding(name, OK, f"exited 0 after {_calls(len(attempts))}")
    if exit_status in (SIGTERM_STATUS, SIGKILL_STATUS):
        # The run's stop (its wall clock, a cap's kill, fail_fast_evidence), which the
        # ledger may not hold: after a lost write under fail_fast_evidence nothing more
        # is written, not even the signal. An agent does not TERM or KILL itself.
        how = "SIGTERM" if exit_status == SIGTERM_STATUS else "SIGKILL"
        return Finding(name, OK, f"stopped by {how} (the run's stop) after {_calls(len(attempts))}")
    if not attempts:
        return Finding(
            name,
            FINDING,
            f"your agent made no call and exited {exit_status}{said}",
            (f"exit status {exit_status}", *((last_stderr[:300],) if last_stderr else ())),
            (),
            ADVICE[name],
        )
    last = attempts[-1]
    how = _outcome(last)
    return Finding(
        name,
        FINDING,
        f"your agent exited {exit_status} after {_calls(len(attempts))}, its last at seq "
        f"{last.seq} ({how}){said}",
        (
            f"seq {last.seq}: {last.type} on {last.provider} ({how})",
            f"exit status {exit_status}",
            *((last_stderr[:300],) if last_stderr else ()),
        ),
        ((last.seq, last.end_seq or last.seq),),
        ADVICE[name],
    )


def _calls(n: int) -> str:
    return f"{n} call" + ("" if n == 1 else "s")


def _outcome(a: Attempt) -> str:
    if a.type != "model.request":
        return f"refused, {a.type}" + (f" {a.status}" if a.status else "")
    if a.ok:
        return "answered"
    if a.end_seq is None:
        return "never closed"
    return f"failed, {a.reason or 'status'}" + (f" {a.status}" if a.status else "")


# ---------------------------------------------------------------- retry budget


def retry_budget(
    events: Sequence[Mapping],
    providers: Iterable[str],
    *,
    ratio: Fraction = DEFAULT_RATIO,
    floor: int = DEFAULT_FLOOR,
) -> dict:
    """Whether the agent's retries stayed within a retry budget (docket.agent.budget, the
    reference agent's: at most `ratio` of its first attempts plus `floor`), with the
    arithmetic. Every attempt it sent counts, forwarded or refused; a logical call's
    first attempt is its first, the rest are retries (grouped as logical_calls says).
    `within` is None when it made no call: nothing to judge."""
    attempts = attempts_of(events, providers)
    calls, how = logical_calls(attempts)
    first, retries = len(calls), len(attempts) - len(calls)
    allowed = allowance(first, ratio, floor)
    within = None if not attempts else retries <= allowed
    sign = "<=" if within or within is None else ">"
    return {
        "within": within,
        "first_attempts": first,
        "retries": retries,
        "allowed": float(allowed),
        "arithmetic": f"{retries} retries {sign} {float(ratio):g} x {first} first attempts "
        f"+ {floor} = {float(allowed):g}",
        "grouped": how,
    }


# ---------------------------------------------------------------- by name


@dataclass(frozen=True)
class Facts:
    """What an agent check reads besides the events."""

    providers: tuple[str, ...]
    exit_status: int | None = None  # the agent's own
    grace_s: float = 2.0
    last_stderr: str = ""  # the agent's last stderr line


CHECKS: dict[str, Callable[[Sequence[Mapping], Facts, int | None], Finding]] = {
    "honours_retry_after": lambda ev, f, n: honours_retry_after(ev, f.providers),
    "backs_off_with_jitter": lambda ev, f, n: backs_off_with_jitter(ev, f.providers),
    "no_retry_on_cap_denial": lambda ev, f, n: no_retry_on_cap_denial(ev, f.providers),
    "max_attempts": lambda ev, f, n: max_attempts(ev, f.providers, at_most=n or 1),
    "handles_cut_stream": lambda ev, f, n: handles_cut_stream(
        ev, f.providers, exit_status=f.exit_status
    ),
    "exits_on_sigterm": lambda ev, f, n: exits_on_sigterm(
        ev, grace_s=f.grace_s, exit_status=f.exit_status
    ),
    "runs_to_the_end": lambda ev, f, n: runs_to_the_end(
        ev, f.providers, exit_status=f.exit_status, last_stderr=f.last_stderr
    ),
}
ALWAYS = ("runs_to_the_end",)  # judged for every user agent, whatever the phase declares
NEEDS_NUMBER = ("max_attempts",)  # declared as `max_attempts: N`


def run_check(name: str, events: Sequence[Mapping], facts: Facts, number: int | None) -> Finding:
    """One declared check; a bug in it is a not_shown finding naming the exception."""
    try:
        return CHECKS[name](events, facts, number)
    except Exception as exc:  # noqa: BLE001 - odd evidence: say why, never crash the day
        return Finding(name, NOT_SHOWN, f"could not be judged: {type(exc).__name__}: {exc}")
