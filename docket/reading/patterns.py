"""The patterns `docket explain` names, each a small fold over a run's calls and events.

A pattern is fed in seq order (`on_request` when a call is forwarded,
`on_close` when its answer or failure is recorded, `on_event` for every other
event) and says at the end what it found: zero or more Findings, each with the
evidence it rests on (seq ranges, counts) and its impact (spend, calls, wall
time). Nothing here reads a file or a clock; thresholds come in as values.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from docket.pricing import ModelPrice, PriceTable, Usage
from docket.reading.calls import (
    POLICY_REFUSALS,
    REFUSALS,
    TRANSIENT_REFUSALS,
    Call,
    client_attempt,
)
from docket.reading.thresholds import Thresholds
from docket.receipts.tally import usd

# One line of what to do about each pattern, from the resilience patterns the game day's
# agent findings draw on; explain prints it under the finding's evidence.
ADVICE = {
    "runaway-loop": "set a cap that ends it ([caps] max_model_calls or max_usd) and have the "
    "agent stop when it gets the same answer to the same request",
    "retry-storm": "back off with full jitter, honour Retry-After and cap the attempts "
    "(docket/agent/backoff.py does)",
    "retry-budget": "keep retries within a budget, about 10% of first attempts plus a few "
    "(docket/agent/budget.py is one)",
    "cache-miss": "turn on [cache] for identical requests, or stop sending them again",
    "fat-context": "trim or summarise the history before sending it again, and let the "
    "provider cache the prefix that does not change",
    "premium-for-small-calls": "send the small calls to the cheaper model the evidence names",
    "concentration": "look at the named model or provider first: it holds more of the spend "
    "or of the failures than of the calls",
    "policy-denials": "read the rule's reason and change course at the first refusal instead "
    "of asking again",
    "write-scope": "check the paths written outside the scope; roll them back with docket "
    "restore, or widen [explain] write_scope if they were meant",
}


@dataclass
class Finding:
    pattern: str
    summary: str  # one sentence a person reads first
    evidence: dict  # what it rests on: seq ranges, counts
    cost_nusd: int = 0  # the spend involved
    calls: int = 0  # the calls (or attempts) involved
    wall_ms: int = 0  # the wall time they span

    def to_dict(self) -> dict:
        return {
            "pattern": self.pattern,
            "summary": self.summary,
            "impact": {
                "usd": usd(self.cost_nusd),
                "cost_nusd": self.cost_nusd,
                "calls": self.calls,
                "wall_ms": self.wall_ms,
            },
            "evidence": self.evidence,
            "advice": ADVICE.get(self.pattern, ""),
        }


def seq_range_text(first: int, last: int) -> str:
    """A finding's `seq`: the first and last seq it covers, as `docket show --seq` reads them."""
    return f"{first}..{last}"


class Pattern:
    """One pattern's fold: explain calls each hook in ledger order; a pattern
    overrides the hooks it needs, and the others see nothing."""

    name = ""

    def __init__(self, limits: Thresholds) -> None:
        self.limits = limits

    def on_request(self, call: Call) -> None:
        """A call's model.request was read."""

    def on_close(self, call: Call) -> None:
        """A call's closing event (model.response or model.error) was read."""

    def on_event(self, event: dict) -> None:
        """Any other event (not a call's request or close), in ledger order."""

    def findings(self) -> list[Finding]:
        return []


# ---------------------------------------------------------------- runaway-loop


@dataclass
class _Streak:
    ref_bytes: int
    first_seq: int
    first_mono: int
    last_seq: int = 0
    last_mono: int = 0
    calls: int = 0
    cost_nusd: int = 0
    cap: str | None = None  # the cap that refused one of its calls
    cap_seq: int | None = None
    refused: int = 0  # its calls a cap refused
    hashes: set[str] = field(default_factory=set)  # distinct bodies, up to 1000 kept


class RunawayLoop(Pattern):
    """Near-same calls in a row (same provider, model, endpoint; request size within a
    tolerance) that ran into a cap, or ran very long without one. A loop that makes
    progress changes what it sends; one that does not sends the same again."""

    name = "runaway-loop"

    def __init__(self, limits: Thresholds) -> None:
        super().__init__(limits)
        self.current: dict[tuple[str, str, str], _Streak] = {}
        self.done: list[tuple[tuple[str, str, str], _Streak]] = []

    def on_request(self, call: Call) -> None:
        key = (call.provider, call.model, call.endpoint)
        streak = self.current.get(key)
        tol = self.limits.loop_size_tolerance * max(streak.ref_bytes, 1) if streak else 0
        if streak is None or abs(call.request_bytes - streak.ref_bytes) > tol:
            if streak is not None:
                self._close(key, streak)
            streak = self.current[key] = _Streak(call.request_bytes, call.seq, call.mono_ms)
        streak.calls += 1
        streak.last_seq, streak.last_mono = call.seq, call.mono_ms
        if len(streak.hashes) < 1000:
            streak.hashes.add(call.request_sha256)
        call.marks["loop"] = streak

    def on_close(self, call: Call) -> None:
        streak = call.marks.get("loop")
        if streak is not None:
            streak.cost_nusd += call.cost_nusd

    def on_event(self, event: dict) -> None:
        rule = event.get("rule")
        if event["type"] != "policy.denied" or not (type(rule) is str and rule.startswith("caps.")):
            return
        for (provider, model, _), streak in self.current.items():
            if provider == event.get("provider") and model == event.get("model"):
                if streak.cap is None:
                    streak.cap, streak.cap_seq = rule.removeprefix("caps."), event["seq"]
                streak.refused += 1
                streak.last_seq, streak.last_mono = event["seq"], event["mono_ms"]

    def _close(self, key: tuple[str, str, str], streak: _Streak) -> None:
        if streak.calls >= min(self.limits.loop_min_calls, self.limits.loop_min_calls_uncapped):
            self.done.append((key, streak))

    def findings(self) -> list[Finding]:
        for key, streak in self.current.items():
            self._close(key, streak)
        self.current = {}
        out = []
        lim = self.limits
        for (provider, model, endpoint), s in self.done:
            capped = s.cap is not None and s.calls >= lim.loop_min_calls
            if not (capped or s.calls >= lim.loop_min_calls_uncapped):
                continue
            where = f"{provider}/{model} {endpoint}".strip()
            if capped:
                summary = (
                    f"{s.calls} near-same calls to {where} ran on until the {s.cap} cap "
                    f"refused them ({s.refused} refused)"
                )
            else:
                summary = f"{s.calls} near-same calls to {where} with no cap to stop them"
            out.append(
                Finding(
                    self.name,
                    summary,
                    {
                        "seq": seq_range_text(s.first_seq, s.last_seq),
                        "calls": s.calls,
                        "request_bytes": s.ref_bytes,
                        "distinct_bodies": len(s.hashes),
                        "cap": s.cap,
                        "cap_refused_seq": s.cap_seq,
                        "refused_by_cap": s.refused,
                    },
                    s.cost_nusd,
                    s.calls,
                    s.last_mono - s.first_mono,
                )
            )
        return out


# ---------------------------------------------------------------- retry-storm

_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")


def retry_after_ms(event: dict) -> float | None:
    """The Retry-After an answer gave, in ms: the boundary's retry_after_s, or an upstream's
    Retry-After header in seconds (an HTTP date is not read)."""
    value = event.get("retry_after_s")
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value) * 1000
    header = event.get("retry_after")
    if type(header) is str and _SECONDS.fullmatch(header.strip()):
        return float(header) * 1000
    return None


@dataclass
class _Failure:
    seq: int
    mono_ms: int
    kind: str
    retry_after_ms: float | None


@dataclass
class _Storm:
    recalls: int = 0
    first_seq: int | None = None
    last_seq: int = 0
    first_mono: int = 0
    last_mono: int = 0
    ignored_retry_after: int = 0
    by_answer: Counter = field(default_factory=Counter)
    by_marker: int = 0  # re-calls the client itself marked as retries
    cost_nusd: int = 0


class RetryStorm(Pattern):
    """Failed or refused calls answered by immediate re-calls, Retry-After or not.

    A re-call is the next attempt on the same provider (a forwarded call, or one the
    boundary refused too: refusals carry the client's marker as requests do). When
    the client marks its attempts (`client_attempt`, from x-stainless-retry-count), a
    marked retry counts when it came within retry_window_ms or before the Retry-After
    the failure gave, and a marked first attempt (a new logical call) only when it
    came before that Retry-After: a client that ignores the wait it was told to keep
    is storming whatever it calls the request. Without a marker, the timing decides:
    within retry_window_ms, or before the Retry-After.
    """

    name = "retry-storm"

    def __init__(self, limits: Thresholds) -> None:
        super().__init__(limits)
        self.last_failure: dict[str, _Failure] = {}
        self.storms: dict[str, _Storm] = {}

    def _attempt(self, provider: str, seq: int, mono_ms: int, attempt: int | None) -> bool:
        """Whether this attempt is an immediate re-call of the provider's last failure."""
        failure = self.last_failure.pop(provider, None)
        if failure is None:
            return False
        gap = mono_ms - failure.mono_ms
        early = failure.retry_after_ms is not None and gap < failure.retry_after_ms
        if attempt == 0 and not early:
            return False  # a new logical call, after any wait it was asked to keep
        if attempt is None and gap > self.limits.retry_window_ms:
            return False
        if attempt is not None and gap > self.limits.retry_window_ms and not early:
            return False
        storm = self.storms.setdefault(provider, _Storm())
        storm.recalls += 1
        if storm.first_seq is None:
            storm.first_seq, storm.first_mono = failure.seq, failure.mono_ms
        storm.last_seq, storm.last_mono = seq, mono_ms
        storm.by_answer[failure.kind] += 1
        storm.ignored_retry_after += early
        storm.by_marker += attempt is not None
        return True

    def on_request(self, call: Call) -> None:
        if self._attempt(call.provider, call.seq, call.mono_ms, call.client_attempt):
            call.marks["recall"] = True

    def on_close(self, call: Call) -> None:
        if call.marks.get("recall"):
            self.storms[call.provider].cost_nusd += call.cost_nusd
        if not call.ok and call.end_seq is not None and call.end_mono_ms is not None:
            self.last_failure[call.provider] = _Failure(
                call.end_seq, call.end_mono_ms, "model.error", call.marks.get("retry_after_ms")
            )

    def on_event(self, event: dict) -> None:
        kind = event["type"]
        if kind not in TRANSIENT_REFUSALS and kind not in POLICY_REFUSALS:
            return
        provider = event.get("provider")
        if type(provider) is not str:
            return
        self._attempt(provider, event["seq"], event["mono_ms"], client_attempt(event))
        if kind in TRANSIENT_REFUSALS:  # a refusal that will never pass is not retried
            self.last_failure[provider] = _Failure(
                event["seq"], event["mono_ms"], kind, retry_after_ms(event)
            )

    def findings(self) -> list[Finding]:
        out = []
        for provider, s in self.storms.items():
            if s.recalls < self.limits.retry_min_recalls or s.first_seq is None:
                continue
            how = "by the client's own attempt markers" if s.by_marker else "by their timing"
            out.append(
                Finding(
                    self.name,
                    f"{s.recalls} failed or refused calls to {provider} were called again at once "
                    f"({s.ignored_retry_after} before the Retry-After they were given), "
                    f"told apart {how}",
                    {
                        "seq": seq_range_text(s.first_seq, s.last_seq),
                        "provider": provider,
                        "immediate_recalls": s.recalls,
                        "ignored_retry_after": s.ignored_retry_after,
                        "answered": dict(sorted(s.by_answer.items())),
                        "marked_by_client": s.by_marker,
                        "window_ms": self.limits.retry_window_ms,
                    },
                    s.cost_nusd,
                    s.recalls,
                    s.last_mono - s.first_mono,
                )
            )
        return out


# ---------------------------------------------------------------- retry-budget


@dataclass
class _Marked:
    first_attempts: int = 0
    retries: int = 0
    refused_retries: int = 0  # of the retries, those the boundary answered itself
    first_seq: int = 0
    first_mono: int = 0
    last_seq: int = 0
    last_mono: int = 0
    over_seq: int | None = None  # the first retry past the budget as it stood then
    cost_nusd: int = 0  # what its forwarded retries cost


class RetryBudget(Pattern):
    """A client's retries on one provider over its budget: more than retry_budget_ratio
    of its first attempts plus retry_budget_floor (the reference agent keeps within
    0.1 and 3: docket.agent.budget). Counted from the attempts the client marked
    (`client_attempt`, from x-stainless-retry-count): 0 is a first attempt, 1 or more
    a retry, whether the boundary forwarded it (model.request) or refused it (the
    refusal carries the marker too), since the client sent both and a client's budget
    counts what it sends. A run whose client marks nothing is not judged here."""

    name = "retry-budget"

    def __init__(self, limits: Thresholds) -> None:
        super().__init__(limits)
        self.by_provider: dict[str, _Marked] = {}

    def _allowed(self, first_attempts: int) -> float:
        return self.limits.retry_budget_floor + self.limits.retry_budget_ratio * first_attempts

    def _attempt(self, provider: str, seq: int, mono_ms: int, attempt: int) -> bool:
        """Count one marked attempt; whether it is a retry."""
        m = self.by_provider.get(provider)
        if m is None:
            m = self.by_provider[provider] = _Marked(first_seq=seq, first_mono=mono_ms)
        m.last_seq, m.last_mono = seq, mono_ms
        if attempt == 0:
            m.first_attempts += 1
            return False
        m.retries += 1
        if m.over_seq is None and m.retries > self._allowed(m.first_attempts):
            m.over_seq = seq
        return True

    def on_request(self, call: Call) -> None:
        if call.client_attempt is not None and self._attempt(
            call.provider, call.seq, call.mono_ms, call.client_attempt
        ):
            call.marks["budget_retry"] = True

    def on_close(self, call: Call) -> None:
        if call.marks.get("budget_retry"):
            self.by_provider[call.provider].cost_nusd += call.cost_nusd

    def on_event(self, event: dict) -> None:
        provider, attempt = event.get("provider"), client_attempt(event)
        if event["type"] not in REFUSALS or type(provider) is not str or attempt is None:
            return
        if self._attempt(provider, event["seq"], event["mono_ms"], attempt):
            self.by_provider[provider].refused_retries += 1

    def findings(self) -> list[Finding]:
        out = []
        ratio, floor = self.limits.retry_budget_ratio, self.limits.retry_budget_floor
        for provider, m in self.by_provider.items():
            allowed = self._allowed(m.first_attempts)
            if m.retries <= allowed:
                continue
            out.append(
                Finding(
                    self.name,
                    f"{m.retries} retries to {provider} against {m.first_attempts} first "
                    f"attempts: over the retry budget of {ratio:g} per first attempt + "
                    f"{floor} ({allowed:g})",
                    {
                        "seq": seq_range_text(m.first_seq, m.last_seq),
                        "provider": provider,
                        "first_attempts": m.first_attempts,
                        "retries": m.retries,
                        "refused_retries": m.refused_retries,
                        "allowed": allowed,
                        "arithmetic": f"{m.retries} retries > {ratio:g} x {m.first_attempts} "
                        f"first attempts + {floor} = {allowed:g}",
                        "first_over_seq": m.over_seq,
                    },
                    m.cost_nusd,
                    m.retries,
                    m.last_mono - m.first_mono,
                )
            )
        return out


# ---------------------------------------------------------------- cache-miss


class CacheMiss(Pattern):
    """One identical request (same request_sha256) answered and paid for again and again.

    A call the response cache answered is a `cache.hit`, not a model call: it never
    reaches on_close, so a repeat served from the cache is not named here (it was not
    paid for; tests/test_cache_run.py).

    Every distinct request paid for is remembered once, compactly (16 bytes of its
    hash and one int): explain's memory grows with the distinct requests of a run,
    ~200 bytes each, where show's does not grow at all.
    """

    name = "cache-miss"
    _MONO_BITS = 53  # mono_ms < 2^53 (the chain bounds it)

    def __init__(self, limits: Thresholds) -> None:
        super().__init__(limits)
        self.first: dict[bytes, int] = {}  # hash prefix -> first paid answer's seq and mono_ms
        # hash prefix -> [paid answers, cost of all but the first, first seq, last seq,
        # first mono, last mono], for requests paid for more than once
        self.paid: dict[bytes, list[int]] = {}

    def on_close(self, call: Call) -> None:
        if not call.ok or not call.cost_nusd or not call.request_sha256:
            return
        digest = call.request_sha256
        try:
            key = bytes.fromhex(digest)[:16] if len(digest) == 64 else digest.encode()
        except ValueError:
            key = digest.encode()
        entry = self.paid.get(key)
        if entry is None:
            packed = self.first.get(key)
            if packed is None:
                self.first[key] = (call.seq << self._MONO_BITS) | call.mono_ms
                return
            seq, mono = packed >> self._MONO_BITS, packed & ((1 << self._MONO_BITS) - 1)
            entry = self.paid[key] = [1, 0, seq, seq, mono, mono]
        entry[0] += 1
        entry[1] += call.cost_nusd
        entry[3], entry[5] = call.seq, call.mono_ms

    def findings(self) -> list[Finding]:
        repeated = [e for e in self.paid.values() if e[0] >= self.limits.cache_min_repeats]
        if not repeated:
            return []
        again = sum(e[0] - 1 for e in repeated)
        worst = max(repeated, key=lambda e: e[0])
        return [
            Finding(
                self.name,
                f"{len(repeated)} identical "
                + ("request was" if len(repeated) == 1 else "requests were")
                + f" paid for {again} more "
                + ("time" if again == 1 else "times")
                + f" (the most repeated, {worst[0]} times)",
                {
                    "seq": seq_range_text(min(e[2] for e in repeated), max(e[3] for e in repeated)),
                    "requests_repeated": len(repeated),
                    "paid_again": again,
                    "most_repeated": worst[0],
                },
                sum(e[1] for e in repeated),
                again,
                max(e[5] for e in repeated) - min(e[4] for e in repeated),
            )
        ]


# ---------------------------------------------------------------- fat-context


def _input_cost(tokens: int, price: str | None) -> int:
    return 0 if price is None else int(Decimal(price) * 1000) * tokens


@dataclass
class _Growth:
    first_seq: int
    first_mono: int
    first_tokens: int
    last_seq: int = 0
    last_mono: int = 0
    last_tokens: int = 0
    calls: int = 0
    input_tokens: int = 0
    input_cost: int = 0


class FatContext(Pattern):
    """Input that grows call after call (the whole history resent), or that dwarfs the output."""

    name = "fat-context"

    def __init__(self, limits: Thresholds) -> None:
        super().__init__(limits)
        self.growth: dict[tuple[str, str], _Growth] = {}
        self.best: dict[tuple[str, str], _Growth] = {}
        # per model: input tokens, output tokens, input cost, calls, first seq/mono, last seq/mono
        self.totals: dict[tuple[str, str], list[int]] = {}

    def on_close(self, call: Call) -> None:
        if not call.ok:
            return
        key = (call.provider, call.model)
        tokens = call.input_tokens + call.cached_tokens
        cost = _input_cost(call.input_tokens, call.input_price)
        t = self.totals.setdefault(key, [0, 0, 0, 0, call.seq, call.mono_ms, 0, 0])
        t[0] += tokens
        t[1] += call.output_tokens
        t[2] += cost
        t[3] += 1
        t[6], t[7] = call.seq, call.mono_ms
        g = self.growth.get(key)
        if g is None or tokens < g.last_tokens:
            self._keep(key)
            g = self.growth[key] = _Growth(call.seq, call.mono_ms, tokens)
        g.calls += 1
        g.last_seq, g.last_mono, g.last_tokens = call.seq, call.mono_ms, tokens
        g.input_tokens += tokens
        g.input_cost += cost

    def _keep(self, key: tuple[str, str]) -> None:
        g = self.growth.get(key)
        lim = self.limits
        if (
            g is not None
            and g.calls >= lim.fat_growth_calls
            and g.input_tokens >= lim.fat_min_input_tokens
            and g.last_tokens >= lim.fat_growth_ratio * max(g.first_tokens, 1)
        ):
            best = self.best.get(key)
            if best is None or g.input_cost > best.input_cost:
                self.best[key] = g

    def findings(self) -> list[Finding]:
        for key in list(self.growth):
            self._keep(key)
        out = []
        lim = self.limits
        for (provider, model), g in self.best.items():
            out.append(
                Finding(
                    self.name,
                    f"input to {provider}/{model} grew from {g.first_tokens} to {g.last_tokens} "
                    f"tokens over {g.calls} calls in a row",
                    {
                        "seq": seq_range_text(g.first_seq, g.last_seq),
                        "calls": g.calls,
                        "first_input_tokens": g.first_tokens,
                        "last_input_tokens": g.last_tokens,
                        "input_tokens": g.input_tokens,
                    },
                    g.input_cost,
                    g.calls,
                    g.last_mono - g.first_mono,
                )
            )
        for (provider, model), t in self.totals.items():
            if (provider, model) in self.best or t[0] < lim.fat_min_input_tokens:
                continue
            if t[0] >= lim.fat_dwarf_ratio * max(t[1], 1):
                out.append(
                    Finding(
                        self.name,
                        f"{provider}/{model} read {t[0]} input tokens for {t[1]} output tokens "
                        f"({t[0] // max(t[1], 1)} to 1)",
                        {
                            "seq": seq_range_text(t[4], t[6]),
                            "calls": t[3],
                            "input_tokens": t[0],
                            "output_tokens": t[1],
                        },
                        t[2],
                        t[3],
                        t[7] - t[5],
                    )
                )
        return out


# ---------------------------------------------------------------- premium-for-small-calls


def cheapest_alternative(table: PriceTable, model: str) -> tuple[ModelPrice, ModelPrice] | None:
    """The model's price and its provider's cheapest model by output price, if one is cheaper."""
    price = table.lookup(model)
    if price is None:
        return None
    same = [p for p in table.models.values() if p.provider == price.provider]
    cheapest = min(same, key=lambda p: (p.output, p.input, p.model))
    return (price, cheapest) if cheapest.output < price.output else None


class PremiumForSmallCalls(Pattern):
    """An expensive model answering tiny outputs, with what the provider's cheapest
    model would have charged for the same tokens at the table's prices."""

    name = "premium-for-small-calls"

    def __init__(self, limits: Thresholds, table: PriceTable) -> None:
        super().__init__(limits)
        self.table = table
        # model -> [calls, cost, cheap cost, first seq, last seq, first mono, last mono]
        self.small: dict[str, list[int]] = {}
        self.alternatives: dict[str, tuple[ModelPrice, ModelPrice] | None] = {}

    def on_close(self, call: Call) -> None:
        if not call.ok or call.output_tokens > self.limits.premium_max_output_tokens:
            return
        if call.model not in self.alternatives:
            self.alternatives[call.model] = cheapest_alternative(self.table, call.model)
        pair = self.alternatives[call.model]
        if (
            pair is None
            or pair[0].output < Decimal(str(self.limits.premium_price_ratio)) * pair[1].output
        ):
            return
        cheap = pair[1].cost_of(Usage(call.input_tokens, call.output_tokens, call.cached_tokens))
        s = self.small.setdefault(call.model, [0, 0, 0, call.seq, 0, call.mono_ms, 0])
        s[0] += 1
        s[1] += call.cost_nusd
        s[2] += cheap
        s[4], s[6] = call.seq, call.mono_ms

    def findings(self) -> list[Finding]:
        out = []
        for model, s in self.small.items():
            if s[0] < self.limits.premium_min_calls:
                continue
            pair = self.alternatives[model]
            assert pair is not None  # only models with a cheaper alternative are counted
            saving = max(s[1] - s[2], 0)
            out.append(
                Finding(
                    self.name,
                    f"{s[0]} calls to {model} answered at most "
                    f"{self.limits.premium_max_output_tokens} tokens; {pair[1].model} would have "
                    f"cost ${usd(s[2])} instead of ${usd(s[1])}",
                    {
                        "seq": seq_range_text(s[3], s[4]),
                        "model": model,
                        "calls": s[0],
                        "cheaper_model": pair[1].model,
                        "saving_usd": usd(saving),
                        "table_date": self.table.date,
                    },
                    saving,
                    s[0],
                    s[6] - s[5],
                )
            )
        return out


# ---------------------------------------------------------------- concentration


class Concentration(Pattern):
    """One model or provider holding most of the spend, or most of the failures, well
    beyond its share of the calls (a share that follows the calls is no finding)."""

    name = "concentration"

    def __init__(self, limits: Thresholds) -> None:
        super().__init__(limits)
        # (axis, name) -> [calls, cost, failures]
        self.groups: dict[tuple[str, str], list[int]] = {}

    def on_close(self, call: Call) -> None:
        for key in (("provider", call.provider), ("model", call.model)):
            g = self.groups.setdefault(key, [0, 0, 0])
            g[0] += 1
            g[1] += call.cost_nusd
            g[2] += not call.ok

    def findings(self) -> list[Finding]:
        lim = self.limits
        out: list[Finding] = []
        named: set[tuple[str, tuple[int, ...]]] = set()  # (of, figures) already named
        for axis in ("provider", "model"):
            groups = {name: g for (a, name), g in self.groups.items() if a == axis}
            if len(groups) < 2:
                continue
            calls = sum(g[0] for g in groups.values())
            for what, i, floor in (
                ("spend", 1, 1),
                ("failures", 2, lim.concentration_min_failures),
            ):
                total = sum(g[i] for g in groups.values())
                if total < floor:
                    continue
                for name, g in groups.items():
                    share, call_share = g[i] / total, g[0] / calls
                    if (
                        share < lim.concentration_share
                        or share < lim.concentration_lift * call_share
                    ):
                        continue
                    if (what, tuple(g)) in named:  # a provider's only model: said once
                        continue
                    named.add((what, tuple(g)))
                    out.append(
                        Finding(
                            self.name,
                            f"{axis} {name} holds {share:.0%} of the {what} "
                            f"with {call_share:.0%} of the calls",
                            {
                                "axis": axis,
                                "name": name,
                                "of": what,
                                "share": round(share, 4),
                                "call_share": round(call_share, 4),
                                "calls": g[0],
                                "failures": g[2],
                            },
                            g[1],
                            g[0],
                            0,
                        )
                    )
        return out


# ---------------------------------------------------------------- policy-denials


@dataclass
class _Rule:
    count: int = 0
    first_seq: int = 0
    last_seq: int = 0
    first_mono: int = 0
    last_mono: int = 0
    then_called: int = 0  # attempts after one of its refusals, on the same provider
    then_refused: int = 0  # of those, refused again (by any rule)
    waiting: set[str] = field(default_factory=set)  # providers whose next attempt is counted


class PolicyDenials(Pattern):
    """Refusals the agent kept running into: which rule, how often, and what it did next."""

    name = "policy-denials"

    def __init__(self, limits: Thresholds) -> None:
        super().__init__(limits)
        self.rules: dict[str, _Rule] = {}

    def _next(self, provider: str, refused: bool) -> None:
        for rule in self.rules.values():
            if provider in rule.waiting:
                rule.waiting.discard(provider)
                rule.then_called += 1
                rule.then_refused += refused

    def on_request(self, call: Call) -> None:
        self._next(call.provider, False)

    def on_event(self, event: dict) -> None:
        kind = event["type"]
        if kind not in POLICY_REFUSALS and kind not in TRANSIENT_REFUSALS:
            return
        provider = event.get("provider")
        provider = provider if type(provider) is str else ""
        self._next(provider, True)
        if kind not in POLICY_REFUSALS:
            return
        name = event.get("rule")
        name = name if type(name) is str else kind
        r = self.rules.get(name)
        if r is None:
            r = self.rules[name] = _Rule(first_seq=event["seq"], first_mono=event["mono_ms"])
        r.count += 1
        r.last_seq, r.last_mono = event["seq"], event["mono_ms"]
        r.waiting.add(provider)

    def findings(self) -> list[Finding]:
        out = []
        for name, r in self.rules.items():
            if r.count < self.limits.denial_min_repeats:
                continue
            out.append(
                Finding(
                    self.name,
                    f"{name} refused the agent {r.count} times; after a refusal it called again "
                    f"{r.then_called} times, {r.then_refused} of them refused again",
                    {
                        "seq": seq_range_text(r.first_seq, r.last_seq),
                        "rule": name,
                        "refusals": r.count,
                        "called_again": r.then_called,
                        "refused_again": r.then_refused,
                    },
                    0,
                    r.count,
                    r.last_mono - r.first_mono,
                )
            )
        return out


# ---------------------------------------------------------------- write-scope


class WriteScope(Pattern):
    """Files the run changed outside what it was meant to touch: judged only from the
    `snapshot.changes` events (docket run --snapshot, one per snapshot root) and a
    declared scope ([explain] write_scope: path prefixes relative to each snapshot's
    root); without both, "not judged" and why, never a guess."""

    name = "write-scope"

    def __init__(self, limits: Thresholds) -> None:
        super().__init__(limits)
        self.changes: dict[int, dict] = {}  # snapshot index -> its last snapshot.changes

    def on_event(self, event: dict) -> None:
        if event["type"] == "snapshot.changes":
            self.changes[event["index"]] = event

    def not_judged(self) -> str | None:
        """Why write-scope cannot be judged for this run, or None when it can."""
        if not self.changes:
            return "no snapshot.changes event (run with docket run --snapshot)"
        for e in self.changes.values():
            if type(e.get("error")) is str:
                return f"the snapshot's change scan failed: {e['error']}"
        if not self.limits.write_scope:
            return "no scope declared ([explain] write_scope in the policy)"
        return None

    def findings(self) -> list[Finding]:
        if self.not_judged() is not None:
            return []
        outside: list[str] = []
        seqs: list[int] = []
        for e in self.changes.values():
            before = len(outside)
            for kind in ("created", "modified", "deleted", "mode_changed"):
                rows = e.get(kind)
                for row in rows if isinstance(rows, list) else ():
                    path = row.get("path") if isinstance(row, dict) else None
                    if type(path) is str and not under(path, self.limits.write_scope):
                        outside.append(f"{kind} {path}")
            if len(outside) > before:
                seqs.append(e["seq"])
        if not outside:
            return []
        return [
            Finding(
                self.name,
                f"the run changed {len(outside)} paths outside its scope",
                {
                    "seq": seq_range_text(min(seqs), max(seqs)),
                    "outside_scope": outside[:20],
                    "count": len(outside),
                    "scope": list(self.limits.write_scope),
                },
            )
        ]


def under(path: str, prefixes: tuple[str, ...]) -> bool:
    """Whether `path` is one of `prefixes` or inside one of them (whole components)."""
    return any(path == p.rstrip("/") or path.startswith(p.rstrip("/") + "/") for p in prefixes)
