"""Whether a cache.hit is a genuine replay: checked against the ledger of the run whose
answer it served (its own ledger for the run's store; the ledger of `replays_run` for
a shared store). Pure: events in, the first disagreement out.

A hit is genuine when the event at its `replays_seq` there is the model.response that
stored the answer (`cache_stored: true`), recorded the same answer bytes
(`cache_body_sha256` is the hit's `body_sha256`) and cost what the hit says it saved
(`cost_nusd` is `saved_nusd`), to a model.request of the same call whose
`request_sha256` and provider are the hit's. The origin ledger is hash-chained and
ends in its own receipt, so an agent that forges a store entry cannot forge this too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def hit_problem(hit: Mapping[str, object], origin: Iterable[Mapping[str, object]]) -> str | None:
    """Why `hit` is not a replay of an answer `origin` recorded, or None if it is."""
    events = list(origin)
    run = hit.get("replays_run")
    if run is not None:
        starts = [e for e in events if e.get("type") == "session.start"]
        if not starts or starts[0].get("run_id") != run:
            return f"the origin ledger is not run {run!r}'s"
    by_seq = {e.get("seq"): e for e in events}
    stored = by_seq.get(hit.get("replays_seq"))
    if stored is None or stored.get("type") != "model.response":
        return f"seq {hit.get('replays_seq')} of the origin is not a model.response"
    if stored.get("cache_stored") is not True:
        return f"the model.response at seq {stored.get('seq')} stored no answer"
    if stored.get("cache_body_sha256") != hit.get("body_sha256"):
        return "the answer served is not the answer stored (body_sha256 differs)"
    if stored.get("cost_nusd") != hit.get("saved_nusd"):
        return (
            f"saved_nusd {hit.get('saved_nusd')} is not what the stored call cost"
            f" ({stored.get('cost_nusd')})"
        )
    requests = [
        e
        for e in events
        if e.get("type") == "model.request" and e.get("call_id") == stored.get("call_id")
    ]
    if not requests:
        return f"no model.request of call {stored.get('call_id')!r} in the origin"
    request = requests[0]
    if request.get("request_sha256") != hit.get("request_sha256"):
        return "the request answered is not the request stored (request_sha256 differs)"
    if request.get("provider") != hit.get("provider"):
        return "the provider differs from the stored call's"
    return None
