"""The running fold of a ledger's events into the figures a receipt states.

Pure and bounded: `add` takes one decoded event at a time and keeps counters
per model, per cap and per fault, never the events, so ten million events cost
the same memory as ten. The ledger writer folds every durable event as it
lands; `docket verify` folds the file the same way; a receipt is honest when
the two agree. spec/docket-receipt-1.md ("Event contents", "Claims") is the
normative text for what is read and how it adds up.
"""

from __future__ import annotations

import re

from docket.ledger.strict_json import MAX_INT
from docket.receipts.fleet_claims import FleetFold, start_fleet
from docket.receipts.readers import HEX64, TallyError
from docket.receipts.readers import count as _count
from docket.receipts.readers import text as _text
from docket.receipts.snapshot_claims import SnapshotFold

# Counters kept per model; the overall totals are their sums.
COUNTERS = (
    "model_calls",
    "responses",
    "errors",
    "refused",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "cost_nusd",
    "unpriced_calls",
)
_CALLS, _RESPONSES, _ERRORS, _REFUSED, _INPUT, _OUTPUT, _CACHED, _COST, _UNPRICED = range(9)
USAGE_FIELDS = ("input_tokens", "output_tokens", "cached_tokens")
PRICE_FIELDS = ("input", "output", "cached_input")
EVIDENCE_FIELDS = ("ledger_complete", "unwritten_events", "first_failing_seq", "write_failures")
# Disclosed when the writer knows them (docket 0.x receipts may lack them): model
# calls that went upstream with no model.request on disk, and the last write error.
# unverified_tail: the file may go on past the durable record (a write that failed
# and could not be cut back); verify then checks the record's prefix only.
EVIDENCE_EXTRA = ("unrecorded_calls", "last_error", "unverified_tail", "unwritten_by_type")

_FORWARDED_DIGEST = re.compile(r"[0-9a-f]{64}")


def _check_forwarded(event: dict) -> None:
    """model.request's record of bytes forwarded other than the agent's (spec section 5):
    forwarded_sha256 and forwarded_changes both absent or null, or both present, the
    digest 64 lowercase hex and not request_sha256, the changes a non-empty list of strings."""
    digest, changes = event.get("forwarded_sha256"), event.get("forwarded_changes")
    if digest is None and changes is None:
        return
    if digest is None or changes is None:
        raise TallyError("model.request.forwarded_sha256 and forwarded_changes come together")
    if type(digest) is not str or not _FORWARDED_DIGEST.fullmatch(digest):
        raise TallyError("model.request.forwarded_sha256 must be 64 lowercase hex digits")
    if digest == event.get("request_sha256"):
        raise TallyError("model.request.forwarded_sha256 must differ from request_sha256")
    if type(changes) is not list or not changes or any(type(c) is not str for c in changes):
        raise TallyError("model.request.forwarded_changes must be a non-empty list of strings")


# The refusal events other than policy.denied, each one guard's, and the rule it counts
# under in totals.refused_by_rule (spec section 6.5). policy.denied counts under its own
# `rule` member, up to the first "." (caps.max_usd -> caps): refusal_rule.
GUARD_REFUSALS = {
    "x-docket.rate-limited": "rate_limit",
    "x-docket.breaker-open": "breaker",
    "load.shed": "load_shed",
    "net.denied": "egress",
}
POLICY_RULE_ABSENT = "policy"  # a policy.denied that names no rule


def refusal_rule(event_type: str, rule: str | None) -> str:
    """The name a refused call counts under in totals.refused_by_rule: the guard's for a
    guard's own event, else the refusal's `rule` up to its first "." (spec section 6.5).
    The boundary names a refusal it could not record (session.end's refused_unrecorded)
    the same way, so both land on one key."""
    fixed = GUARD_REFUSALS.get(event_type)
    if fixed is not None:
        return fixed
    return POLICY_RULE_ABSENT if rule is None else rule.partition(".")[0]


def fault_layer(event: dict) -> str:
    """The layer a fault.injected hit (spec section 6.5): its `target` member, else its
    fault text's target (the grammar's `target ":"`), leading spaces and tabs dropped."""
    target = event.get("target")
    if target is not None:
        return _text(target, "fault.injected.target")
    return event["fault"].lstrip(" \t").partition(":")[0]


# USD per million tokens, at most 3 decimals: then a token costs a whole number of nano-USD.
PRICE_PATTERN = re.compile(r"(0|[1-9][0-9]{0,8})(\.[0-9]{1,3})?")


class _Unbacked:
    """Marks a claim the ledger cannot back: the event it comes from was never written."""

    def __repr__(self) -> str:
        return "UNBACKED"

    def __copy__(self) -> _Unbacked:  # one marker, compared by identity
        return self

    def __deepcopy__(self, memo: dict) -> _Unbacked:
        return self

    def __reduce__(self) -> str:
        return "UNBACKED"


UNBACKED = _Unbacked()
_UNSEEN = object()


def usd(nusd: int) -> str:
    """Nano-USD as a decimal string with 9 places: 1234000 -> '0.001234000'."""
    return f"{nusd // 1_000_000_000}.{nusd % 1_000_000_000:09d}"


# The members of a closing event that are the response cache's (section 7.8).
_CACHE_CLOSE = frozenset({"cache_stored", "cache_refused", "cache_body_sha256"})


def _digest_or_null(value: object, where: str) -> str | None:
    """A SHA-256 in 64 lowercase hex digits, or absent/null."""
    if value is None:
        return None
    if type(value) is not str or not HEX64.match(value):
        raise TallyError(f"{where} must be 64 lowercase hex digits or absent")
    return value


def _text_or_null(value: object, where: str) -> str | None:
    return None if value is None else _text(value, where)


def _object(value: object, where: str) -> dict:
    if type(value) is not dict:
        raise TallyError(f"{where} must be an object")
    return value


def _model(event: dict) -> str:
    # A call whose model is not known (a refusal before the body was read) counts under "".
    model = event.get("model")
    return "" if model is None else _text(model, f"{event['type']}.model")


def _provider_of(event: dict) -> str:
    # Like the model: a refusal before the route was known names none, and counts under "".
    provider = event.get("provider")
    return "" if provider is None else _text(provider, f"{event['type']}.provider")


def _call_id(event: dict) -> str | None:
    # A call's events share its call_id; without one an event pairs with nothing.
    call_id = event.get("call_id")
    return None if call_id is None else _text(call_id, f"{event['type']}.call_id")


def _usage(event: dict) -> tuple[int, int, int]:
    # Absent usage, or an absent member, is zero: a failed call may know only part of it.
    usage = event.get("usage")
    if usage is None:
        return 0, 0, 0
    where = f"{event['type']}.usage"
    _object(usage, where)
    return (
        _count(usage.get("input_tokens", 0), f"{where}.input_tokens"),
        _count(usage.get("output_tokens", 0), f"{where}.output_tokens"),
        _count(usage.get("cached_tokens", 0), f"{where}.cached_tokens"),
    )


def _charge(event: dict) -> tuple[str, int, int, int, int]:
    """model, input, output and cached tokens, and cost_nusd of a response or error."""
    model, usage, cost = event.get("model"), event.get("usage"), event.get("cost_nusd")
    # The common case, checked inline: verify folds millions of these.
    if type(model) is str and type(usage) is dict and type(cost) is int and 0 <= cost <= MAX_INT:
        i = usage.get("input_tokens", 0)
        o = usage.get("output_tokens", 0)
        c = usage.get("cached_tokens", 0)
        if (
            type(i) is int
            and type(o) is int
            and type(c) is int
            and 0 <= i <= MAX_INT
            and 0 <= o <= MAX_INT
            and 0 <= c <= MAX_INT
        ):
            return model, i, o, c, cost
    i, o, c = _usage(event)  # normalises an absent model or usage, or names the bad field
    return _model(event), i, o, c, _count(cost, f"{event['type']}.cost_nusd")


def check_evidence(value: object, where: str) -> dict:
    """The ops.evidence object: the writer's own account of what it could not write."""
    evidence = _object(value, where)
    missing = [k for k in EVIDENCE_FIELDS if k not in evidence]
    if missing:
        raise TallyError(f"{where} lacks {', '.join(missing)}")
    if type(evidence["ledger_complete"]) is not bool:
        raise TallyError(f"{where}.ledger_complete must be true or false")
    _count(evidence["unwritten_events"], f"{where}.unwritten_events")
    _count(evidence["write_failures"], f"{where}.write_failures")
    if evidence["first_failing_seq"] is not None:
        _count(evidence["first_failing_seq"], f"{where}.first_failing_seq")
    if "unrecorded_calls" in evidence:
        _count(evidence["unrecorded_calls"], f"{where}.unrecorded_calls")
    if "last_error" in evidence:
        _text_or_null(evidence["last_error"], f"{where}.last_error")
    if "unverified_tail" in evidence and type(evidence["unverified_tail"]) is not bool:
        raise TallyError(f"{where}.unverified_tail must be true or false")
    if "unwritten_by_type" in evidence:
        for kind, n in _object(evidence["unwritten_by_type"], f"{where}.unwritten_by_type").items():
            _count(n, f"{where}.unwritten_by_type[{kind!r}]")
    return {k: evidence[k] for k in (*EVIDENCE_FIELDS, *EVIDENCE_EXTRA) if k in evidence}


def _session_start(event: dict) -> dict:
    where = "session.start"
    pricing = _object(event.get("pricing"), f"{where}.pricing")
    chaos = event.get("chaos")
    seed = plan = None
    if chaos is not None:
        _object(chaos, f"{where}.chaos")
        seed = chaos.get("seed")
        if seed is not None and (type(seed) is not int or abs(seed) > MAX_INT):
            raise TallyError(f"{where}.chaos.seed must be an integer or null")
        # the resolved schedule the run declared, as declared: the receipt restates it
        plan = {k: v for k, v in chaos.items() if k != "seed"}
    return {
        "run_id": _text(event.get("run_id"), f"{where}.run_id"),
        "replay_of": _replay_of(event.get("replay_of"), f"{where}.replay_of"),
        "fleet": start_fleet(event.get("fleet"), f"{where}.fleet"),
        "docket_version": _text(event.get("docket_version"), f"{where}.docket_version"),
        "policy_digest": _text(event.get("policy_digest"), f"{where}.policy_digest"),
        "table_date": _text_or_null(pricing.get("table_date"), f"{where}.pricing.table_date"),
        "provenance": _text_or_null(pricing.get("provenance"), f"{where}.pricing.provenance"),
        "limits": _object(event.get("caps"), f"{where}.caps"),
        "seed": seed,
        "plan": plan,
        "ts": _text(event.get("ts"), f"{where}.ts"),
        "mono_ms": _count(event.get("mono_ms"), f"{where}.mono_ms"),
    }


def _replay_of(value: object, where: str) -> dict | None:
    """session.start's replay_of (spec section 7.9): absent or null, or {run_id, head}."""
    if value is None:
        return None
    replayed = _object(value, where)
    if set(replayed) != {"run_id", "head"}:
        raise TallyError(f"{where} must have exactly run_id and head")
    head = replayed["head"]
    if type(head) is not str or len(head) != 64 or not set(head) <= set("0123456789abcdef"):
        raise TallyError(f"{where}.head must be 64 lowercase hex digits")
    return {"run_id": _text(replayed["run_id"], f"{where}.run_id"), "head": head}


def _session_end(event: dict) -> dict:
    where = "session.end"
    status = event.get("exit_status")
    if status is not None and (type(status) is not int or abs(status) > MAX_INT):
        raise TallyError(f"{where}.exit_status must be an integer or null")
    return {
        "reason": _text(event.get("reason"), f"{where}.reason"),
        "exit_status": status,
        "cap": _text_or_null(event.get("cap"), f"{where}.cap"),
        "evidence": check_evidence(event.get("evidence"), f"{where}.evidence"),
        "ts": _text(event.get("ts"), f"{where}.ts"),
        "mono_ms": _count(event.get("mono_ms"), f"{where}.mono_ms"),
    }


class Tally:
    """Feed decoded events in seq order with `add`; read the figures with `to_claims`.

    An event is the decoded ledger line: the common fields (`seq`, `ts`,
    `mono_ms`, `type`, ...) and the event's own. `add` validates everything it
    reads before it changes anything, so an event it rejects leaves no trace.
    """

    def __init__(self) -> None:
        self.events = 0
        self.start: dict | None = None
        self.end: dict | None = None
        # The counters of section 6.4, one set per model, provider and upstream base URL
        # (None: a refusal, which reached no upstream): each event adds to one set, and
        # totals, by_model, by_provider and by_upstream are their sums (to_claims).
        self.cells: dict[str, dict[str, dict[str | None, list[int]]]] = {}
        self.unit_prices: dict[str, dict[str, str]] = {}
        self._raw_prices: dict[str, object] = {}  # as last seen, extra members and all
        self.warnings: dict[str, dict] = {}  # the first cap.warning per cap
        self.breaches: dict[str, dict] = {}  # the first cap.exceeded per cap
        self.faults: dict[str, int] = {}
        self.fault_seed: int | None = None
        self.gaps = 0
        self.lost = 0
        self.first_gap_seq: int | None = None
        # call_id -> seq of each model.request no closing event has followed yet. Bounded
        # by the calls in flight at once: a closed call is dropped.
        self.open: dict[str, int] = {}
        # model.request's client_attempt (the SDK's x-stainless-retry-count) -> requests
        # carrying it; bounded by the distinct attempts, not the requests.
        self.client_attempts: dict[int, int] = {}
        self.snapshot = SnapshotFold()  # the receipt's `snapshot` (section 7.7)
        # The response cache (ops.cache, spec section 7.8): hits, misses, stored answers,
        # refusals to store by reason (bounded by the reasons' vocabulary) and the saving.
        self.cache_counts = [0, 0, 0, 0]  # hits, misses, stored, saved_nusd
        self.cache_refused: dict[str, int] = {}
        # Which rule refused each refused call, which endpoint answered, what the breakers
        # did and where faults hit (spec section 6.5); each bounded by its vocabulary
        # (rules, providers, base URLs, upstreams x states, layers), not by the events.
        self.refusals: dict[str, int] = {}
        self._call_upstream: dict[str, str] = {}  # call_id -> its request's base_url, while open
        self.breaker: dict[str, dict[str, dict[str, int]]] = {}
        self.fault_layers: dict[str, int] = {}
        self.fleet = FleetFold()  # the receipt's `fleet` (section 7.10)
        self._fold = {
            "session.start": self._on_start,
            "session.end": self._on_end,
            "model.request": self._on_request,
            "model.response": self._on_response,
            "model.error": self._on_error,
            "policy.denied": self._on_denied,
            "x-docket.rate-limited": self._on_guard_refusal,
            "x-docket.breaker-open": self._on_guard_refusal,
            "load.shed": self._on_guard_refusal,
            "net.denied": self._on_guard_refusal,
            "breaker.state": self._on_breaker,
            "cap.warning": self._on_cap,
            "cap.exceeded": self._on_cap,
            "fault.injected": self._on_fault,
            "evidence.gap": self._on_gap,
            "snapshot.taken": self._on_snapshot,
            "snapshot.changes": self._on_snapshot,
            "snapshot.restored": self._on_snapshot,
            "cache.hit": self._on_cache_hit,
            "fleet.lease": self._on_fleet,
            "fleet.store": self._on_fleet,
        }

    def add(self, event: dict) -> None:
        if self.end is not None:
            raise TallyError(f"{event['type']} after session.end, which must be the last event")
        fold = self._fold.get(event["type"])
        if fold is not None:  # types the receipt does not sum are counted and otherwise ignored
            fold(event)
        self.events += 1

    def _cell(self, model: str, provider: str, base_url: str | None) -> list[int]:
        """The counters of one model at one provider and upstream, made when first seen."""
        providers = self.cells.get(model)
        if providers is None:
            providers = self.cells[model] = {}
        upstreams = providers.get(provider)
        if upstreams is None:
            upstreams = providers[provider] = {}
        counters = upstreams.get(base_url)
        if counters is None:
            counters = upstreams[base_url] = [0] * len(COUNTERS)
        return counters

    def _found(self, model: object, provider: object, base_url: str) -> list[int] | None:
        """Those counters if they exist (then every key is a string, checked when they
        were made): the common case, one lookup a level, nothing checked again."""
        if type(model) is not str or type(provider) is not str:
            return None
        providers = self.cells.get(model)
        upstreams = None if providers is None else providers.get(provider)
        return None if upstreams is None else upstreams.get(base_url)

    def _on_start(self, event: dict) -> None:
        if self.events:
            raise TallyError("session.start must be the first event, and there is only one")
        self.start = _session_start(event)

    def _on_end(self, event: dict) -> None:
        end = _session_end(event)
        unrecorded = event.get("refused_unrecorded")
        if unrecorded is not None:
            where = "session.end.refused_unrecorded"
            for rule, n in _object(unrecorded, where).items():
                _count(n, f"{where}[{rule!r}]")
            for rule, n in unrecorded.items():
                self.refusals[rule] = self.refusals.get(rule, 0) + n
        self.end = end

    def _on_request(self, event: dict) -> None:
        call_id = _call_id(event)
        attempt = event.get("client_attempt")
        if attempt is not None:
            attempt = _count(attempt, "model.request.client_attempt")
        # The common case, looked up (verify folds millions); else checked, then made.
        base_url = event.get("base_url")
        if type(base_url) is not str:
            if base_url is not None:
                raise TallyError("model.request.base_url must be a string")
            base_url = ""
        counters = self._found(event.get("model"), event.get("provider"), base_url)
        if counters is None:
            counters = self._cell(_model(event), _provider_of(event), base_url)
        counters[_CALLS] += 1
        if call_id is not None:
            self._call_upstream.setdefault(call_id, base_url)
        if attempt is not None:
            self.client_attempts[attempt] = self.client_attempts.get(attempt, 0) + 1
        looked = event.get("cache")
        if looked is not None:
            if looked != "miss":
                raise TallyError('model.request.cache must be "miss" or absent')
            self.cache_counts[1] += 1
        if call_id is not None:
            self.open.setdefault(call_id, event["seq"])
        _check_forwarded(event)

    def replay_of(self, start: dict | None = None) -> object:
        """The receipt's replay_of (spec section 7.9): session.start's (or `start`'s, the
        line that could not be written), null when it has none, UNBACKED without either."""
        if self.start is not None:
            return self.start["replay_of"]
        return UNBACKED if start is None else _session_start(start)["replay_of"]

    def fleet_claims(self, start: dict | None = None) -> object:
        """The receipt's fleet (spec section 7.10): null for a run whose session.start (or
        `start`, the line that could not be written) names no fleet, UNBACKED without either."""
        if self.start is not None:
            return self.fleet.claims(self.start["fleet"])
        return UNBACKED if start is None else self.fleet.claims(_session_start(start)["fleet"])

    def _on_fleet(self, event: dict) -> None:
        fold = self.fleet.on_lease if event["type"] == "fleet.lease" else self.fleet.on_store
        fold(event)

    def client_retries(self) -> dict:
        """The receipt's ops.client_retries (spec section 7.6): model.request events that
        carry the client's attempt marker, those that are a retry (attempt 1 or more),
        and the requests per attempt (keys: the attempt in decimal)."""
        return {
            "marked": sum(self.client_attempts.values()),
            "retries": sum(n for a, n in self.client_attempts.items() if a > 0),
            "by_attempt": {str(a): self.client_attempts[a] for a in sorted(self.client_attempts)},
        }

    def cache(self) -> dict:
        """The receipt's ops.cache (spec section 7.8)."""
        hits, misses, stored, saved = self.cache_counts
        return {
            "hits": hits,
            "misses": misses,
            "stored": stored,
            "refused_by_reason": {r: self.cache_refused[r] for r in sorted(self.cache_refused)},
            "saved_nusd": saved,
        }

    def _on_cache_hit(self, event: dict) -> None:
        saved = _count(event.get("saved_nusd"), "cache.hit.saved_nusd")
        _digest_or_null(event.get("body_sha256"), "cache.hit.body_sha256")
        _count(event.get("replays_seq"), "cache.hit.replays_seq")
        _text_or_null(event.get("replays_run"), "cache.hit.replays_run")  # a shared store's
        self.cache_counts[0] += 1
        self.cache_counts[3] += saved

    def _on_cache_close(self, event: dict) -> None:
        stored = event.get("cache_stored")
        refused = event.get("cache_refused")
        where = f"{event['type']}.cache_body_sha256"
        if (
            _digest_or_null(event.get("cache_body_sha256"), where) is not None
            and stored is not True
        ):
            raise TallyError(f"{where} must be absent unless cache_stored is true")
        if stored is not None:
            if stored is not True or refused is not None:
                raise TallyError(f"{event['type']}.cache_stored must be true, alone, or absent")
            self.cache_counts[2] += 1
        elif refused is not None:
            reason = _text(refused, f"{event['type']}.cache_refused")
            self.cache_refused[reason] = self.cache_refused.get(reason, 0) + 1

    def open_calls(self) -> list[dict]:
        """The model.request events no closing event follows, in seq order: calls
        still open where the ledger ends (the receipt's ops.open_calls)."""
        return [{"call_id": c, "seq": seq} for c, seq in self.open.items()]

    def _on_response(self, event: dict) -> None:
        call_id = _call_id(event)
        name = _provider_of(event)
        model, tokens_in, tokens_out, tokens_cached, cost = _charge(event)
        priced = event.get("priced")
        if priced is not True and priced is not False:
            raise TallyError("model.response.priced must be true or false")
        if priced:
            prices = event.get("unit_prices")
            if prices != self._raw_prices.get(model, _UNSEEN):  # else: as last time, checked then
                checked = _check_prices(prices)
                known = self.unit_prices.get(model)
                if known is not None and checked != known:
                    raise TallyError(
                        f"model.response.unit_prices for {model!r} differ from an earlier response's"
                    )
                self._raw_prices[model] = prices
                self.unit_prices[model] = checked
        base_url = self._close_call(call_id)
        if not _CACHE_CLOSE.isdisjoint(event):
            self._on_cache_close(event)
        counters = self._found(model, name, base_url) or self._cell(model, name, base_url)
        counters[_RESPONSES] += 1
        counters[_INPUT] += tokens_in
        counters[_OUTPUT] += tokens_out
        counters[_CACHED] += tokens_cached
        counters[_COST] += cost
        if not priced:
            counters[_UNPRICED] += 1

    def _close_call(self, call_id: str | None) -> str:
        """Close the call: the base_url of the model.request that opened it, or "" for
        a call no open model.request names."""
        if call_id is None:
            return ""
        self.open.pop(call_id, None)
        return self._call_upstream.pop(call_id, "")

    def _on_error(self, event: dict) -> None:
        call_id = _call_id(event)
        name = _provider_of(event)
        model, tokens_in, tokens_out, tokens_cached, cost = _charge(event)
        base_url = self._close_call(call_id)
        if not _CACHE_CLOSE.isdisjoint(event):
            self._on_cache_close(event)
        counters = self._found(model, name, base_url) or self._cell(model, name, base_url)
        counters[_ERRORS] += 1
        counters[_INPUT] += tokens_in
        counters[_OUTPUT] += tokens_out
        counters[_CACHED] += tokens_cached
        counters[_COST] += cost

    def _on_denied(self, event: dict) -> None:
        rule = _text_or_null(event.get("rule"), "policy.denied.rule")
        model = _model(event)
        name = _provider_of(event)
        key, _, code = (POLICY_RULE_ABSENT, "", "") if rule is None else rule.partition(".")
        self._cell(model, name, None)[_REFUSED] += 1  # no upstream: refused before one
        self.refusals[key] = self.refusals.get(key, 0) + 1
        if key == "fleet":  # the same refusal, by the fleet's code (section 7.10)
            self.fleet.on_refused(code)

    def _on_guard_refusal(self, event: dict) -> None:
        key = GUARD_REFUSALS[event["type"]]
        self.refusals[key] = self.refusals.get(key, 0) + 1

    def _on_breaker(self, event: dict) -> None:
        upstream = _text_or_null(event.get("upstream"), "breaker.state.upstream") or ""
        was = _text(event.get("from"), "breaker.state.from")
        now = _text(event.get("to"), "breaker.state.to")
        froms = self.breaker.get(upstream)
        if froms is None:
            froms = self.breaker[upstream] = {}
        tos = froms.get(was)
        if tos is None:
            tos = froms[was] = {}
        tos[now] = tos.get(now, 0) + 1

    def _on_cap(self, event: dict) -> None:
        kind = event["type"]
        cap = _text(event.get("cap"), f"{kind}.cap")
        for name in ("limit", "observed"):
            if name not in event:
                raise TallyError(f"{kind} lacks {name}")
        firsts = self.warnings if kind == "cap.warning" else self.breaches
        if cap not in firsts:
            firsts[cap] = {
                "cap": cap,
                "seq": event["seq"],
                "limit": event["limit"],
                "observed": event["observed"],
            }

    def _on_fault(self, event: dict) -> None:
        fault = _text(event.get("fault"), "fault.injected.fault")
        seed = event.get("seed")
        if seed is not None and (type(seed) is not int or abs(seed) > MAX_INT):
            raise TallyError("fault.injected.seed must be an integer or null")
        # One run, one seed: the seed session.start declares, else the first fault's.
        if self.start is not None or self.faults:
            expected = self.start["seed"] if self.start is not None else self.fault_seed
            if seed != expected:
                raise TallyError(f"fault.injected.seed {seed} is not the run's seed {expected}")
        layer = fault_layer(event)
        self.fault_seed = seed
        self.faults[fault] = self.faults.get(fault, 0) + 1
        self.fault_layers[layer] = self.fault_layers.get(layer, 0) + 1

    def _on_snapshot(self, event: dict) -> None:
        fold = {
            "snapshot.taken": self.snapshot.on_taken,
            "snapshot.changes": self.snapshot.on_changes,
            "snapshot.restored": self.snapshot.on_restored,
        }[event["type"]]
        fold(event)

    def _on_gap(self, event: dict) -> None:
        lost = _count(event.get("lost"), "evidence.gap.lost")
        first = _count(event.get("first_failing_seq"), "evidence.gap.first_failing_seq")
        if self.first_gap_seq is None:
            self.first_gap_seq = first
        self.gaps += 1
        self.lost += lost

    def to_claims(self, *, start: dict | None = None, end: dict | None = None) -> dict:
        """The receipt's derivable fields, in the receipt's own shape.

        A claim that comes from a session.start or session.end the ledger lacks
        is UNBACKED, unless the writer passes the event it could not write as
        `start`/`end` (a dict shaped like the line would have been).
        """
        s = self.start or (_session_start(start) if start is not None else None)
        e = self.end or (_session_end(end) if end is not None else None)
        if s is None:
            # Its claims are unbacked, but a fault's seed is still on the faults' own lines.
            seed = self.fault_seed if self.faults else UNBACKED
            s = dict.fromkeys(_START_CLAIMS, UNBACKED) | {"seed": seed, "mono_ms": None}
            s["plan"] = UNBACKED
        totals = [0] * len(COUNTERS)
        models: dict[str, list[int]] = {}
        providers: dict[str, list[int]] = {}
        upstreams: dict[str, list[int]] = {}
        for model, at_providers in self.cells.items():
            for provider, at_upstreams in at_providers.items():
                for base_url, counters in at_upstreams.items():
                    sums = [totals, _row(models, model), _row(providers, provider)]
                    if base_url is not None:  # a refusal reached no upstream
                        sums.append(_row(upstreams, base_url))
                    for row in sums:
                        for i, n in enumerate(counters):
                            row[i] += n
        by_model = {m: _counter_dict(models[m]) for m in sorted(models)}
        return {
            "run_id": s["run_id"],
            "docket_version": s["docket_version"],
            "started_at": s["ts"],
            "ended_at": UNBACKED if e is None else e["ts"],
            "duration_ms": UNBACKED
            if e is None or s["mono_ms"] is None
            else e["mono_ms"] - s["mono_ms"],
            "exit": UNBACKED
            if e is None
            else {"status": e["exit_status"], "reason": e["reason"], "cap": e["cap"]},
            "totals": _counter_dict(totals)
            | {
                "by_model": by_model,
                "refused_by_rule": _sorted(self.refusals),
                "by_provider": {p: _counter_dict(providers[p]) for p in sorted(providers)},
                "by_upstream": {u: _counter_dict(upstreams[u]) for u in sorted(upstreams)},
                "breaker_transitions": {
                    u: {f: _sorted(tos) for f, tos in sorted(froms.items())}
                    for u, froms in sorted(self.breaker.items())
                },
            },
            "pricing": {
                "table_date": s["table_date"],
                "provenance": s["provenance"],
                "unit_prices": {m: dict(self.unit_prices[m]) for m in sorted(self.unit_prices)},
            },
            "caps": {
                "limits": s["limits"],
                "warnings": sorted(self.warnings.values(), key=lambda w: w["seq"]),
                "breaches": sorted(self.breaches.values(), key=lambda b: b["seq"]),
            },
            "policy_digest": s["policy_digest"],
            "faults": {
                "seed": s["seed"],
                "plan": s["plan"],
                "injected": sum(self.faults.values()),
                "by_fault": {f: self.faults[f] for f in sorted(self.faults)},
                "by_layer": _sorted(self.fault_layers),
            },
        }


_START_CLAIMS = (
    "run_id",
    "replay_of",
    "fleet",
    "docket_version",
    "policy_digest",
    "table_date",
    "provenance",
    "limits",
    "ts",
)


def _row(rows: dict[str, list[int]], key: str) -> list[int]:
    row = rows.get(key)
    if row is None:
        row = rows[key] = [0] * len(COUNTERS)
    return row


def _check_prices(prices: object) -> dict[str, str]:
    where = "model.response.unit_prices"
    prices = _object(prices, where)
    for name in PRICE_FIELDS:
        value = prices.get(name)
        if type(value) is not str or not PRICE_PATTERN.fullmatch(value):
            raise TallyError(f"{where}.{name} must be a decimal string with at most 3 decimals")
    return {k: prices[k] for k in PRICE_FIELDS}


# The claims a receipt may omit (spec section 6.5): (parent, member). Absent, a claim is
# not made (a receipt from before it), and not compared; Docket omits one that is empty.
OPTIONAL_CLAIMS = (
    ("totals", "refused_by_rule"),
    ("totals", "by_provider"),
    ("totals", "by_upstream"),
    ("totals", "breaker_transitions"),
    ("faults", "by_layer"),
)


def _sorted(counts: dict[str, int]) -> dict[str, int]:
    return {k: counts[k] for k in sorted(counts)}


def _counter_dict(counters: list[int]) -> dict:
    out: dict[str, int | str] = dict(zip(COUNTERS, counters, strict=True))
    out["usd"] = usd(counters[_COST])
    return out
