"""The receipt's `fleet` section, folded from session.start's `fleet`, fleet.lease,
fleet.store and the fleet rule's policy.denied events.

Pure and bounded by the vocabulary (lease changes, refusal codes), never the events.
spec/docket-receipt-1.md section 7.10 is the normative text: the budget and where its
database is (session.start), the lease changes and the amounts they moved, the fleet
rule's refusals by code, the failed exchanges with the database, and how the run's
last lease ended.
"""

from __future__ import annotations

from docket.receipts.readers import TallyError
from docket.receipts.readers import count as _count
from docket.receipts.readers import text as _text

DIMENSIONS = ("nusd", "tokens", "calls")
DATABASE_FIELDS = ("host", "port", "dbname")
# fleet.lease's amount members, by the total they add to: a grant (drawn or renewed),
# what was reported spent (at an exchange or the give-back), what was given back
# unused, and what a lease held when the budget folded it into lapsed (expired).
AMOUNT_PREFIXES = (("granted", "granted"), ("reported", "reported"), ("returned", "unused"))
LAPSED_PREFIX = "held"
# The changes that say what became of the run's own lease; `expired` names a lease
# the budget folded at this run's exchange, which may be another run's.
ENDED_BY = {"drawn": "held", "renewed": "held", "returned": "returned", "lost": "lost"}
NO_LEASE = "none"


def start_fleet(value: object, where: str) -> dict | None:
    """session.start's `fleet`: absent or null (no [fleet]), or {budget, database}, the
    database {host, port, dbname}, each a string or null (never a credential)."""
    if value is None:
        return None
    if type(value) is not dict or set(value) != {"budget", "database"}:
        raise TallyError(f"{where} must be an object of exactly budget and database")
    database = value["database"]
    if type(database) is not dict or set(database) != set(DATABASE_FIELDS):
        raise TallyError(f"{where}.database must be an object of exactly host, port, dbname")
    for name in DATABASE_FIELDS:
        if database[name] is not None:
            _text(database[name], f"{where}.database.{name}")
    return {
        "budget": _text(value["budget"], f"{where}.budget"),
        "database": {name: database[name] for name in DATABASE_FIELDS},
    }


def _zero() -> dict[str, int]:
    return dict.fromkeys(DIMENSIONS, 0)


class FleetFold:
    def __init__(self) -> None:
        self.changes: dict[str, int] = {}
        self.amounts = {total: _zero() for total in ("granted", "reported", "returned", "lapsed")}
        self.refused: dict[str, int] = {}
        self.store_failures = 0
        self.ended = NO_LEASE

    def on_lease(self, event: dict) -> None:
        change = _text(event.get("change"), "fleet.lease.change")
        adds = []  # checked whole before anything is added
        for total, prefix in (*AMOUNT_PREFIXES, ("lapsed", LAPSED_PREFIX)):
            for dim in DIMENSIONS:
                name = f"{prefix}_{dim}"
                value = event.get(name)
                if value is not None:
                    adds.append((total, dim, _count(value, f"fleet.lease.{name}")))
        for total, dim, n in adds:
            self.amounts[total][dim] += n
        self.changes[change] = self.changes.get(change, 0) + 1
        self.ended = ENDED_BY.get(change, self.ended)

    def on_store(self, event: dict) -> None:
        self.store_failures += 1

    def on_refused(self, code: str) -> None:
        self.refused[code] = self.refused.get(code, 0) + 1

    def claims(self, start: dict | None) -> dict | None:
        """The receipt's `fleet`: null for a run without [fleet] (session.start says none)."""
        if start is None:
            return None
        return {
            "budget": start["budget"],
            "database": dict(start["database"]),
            "leases": {c: self.changes[c] for c in sorted(self.changes)},
            **{total: dict(amounts) for total, amounts in self.amounts.items()},
            "refused_by_code": {c: self.refused[c] for c in sorted(self.refused)},
            "store_failures": self.store_failures,
            "ended": self.ended,
        }
