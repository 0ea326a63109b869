"""The attack suite: probes that drive Docket from outside, as a user or an attacker would.

One tiny interface for every probe family: `run(folder, quick) -> Figures`, where
Figures counts what was tried, how many ended in the good outcome, and one line
per failure that reproduces it. `python -m chaos.attack` runs them all and prints
the table; tests/test_attack.py runs each in its quick form. Families:

  http       malformed HTTP on raw sockets against a live `docket run`
  mutations  ledger and receipt mutations, each checked with `docket verify`
  secrets    secrets planted in every place a request can carry one, then every
             byte under the run folder searched in four encodings
  inputs     bad CLI, policy, fault, scenario and phase inputs, and planted ledgers
             for `docket export otel` (chaos/attack/ledgers.py)
  diskfull   the ledger on a small tmpfs the agent fills (root only)
  cache      a shared cache store poisoned, symlinked, another's, or locked (root only)
  exhaustion idle connections past the cap, slowloris heads, half-open bodies,
             EMFILE under a lowered NOFILE, against a live `docket run`
  snapshot   the snapshot store, the run folder's records and the tree attacked by
             an agent of the same user, against a real rollback and docket restore
  excluded   what the snapshot leaves out (.git, node_modules) swapped for links out,
             FIFOs, tens of thousands of entries: the watch on it stays bounded
  numbers    number forms in receipts and ledger lines, through all three verifiers
  orphans    an agent's ways to outlive its run (fork chains and bombs, setsid,
             SIGSTOP, SIGCONT, re-parenting, a /proc snooper for the next key)
  attest     a signed run: readable keys refused, a same-user agent reading the key,
             files swapped after attesting, re-signed, signatures dropped, a huge envelope
  replay     a recorded run's folder planted (edited, swapped, forged with bodies
             the recorder never writes, links, FIFOs, past the bound) before `docket replay`
  fleet      a fleet budget's DSN looked for by the agent, the cap hammered through
             the boundary, the budget table rewritten by an agent holding the DSN
             (held under a runs' role; not held with table rights: extra["open"])

`docket/` never imports this package (tests/test_layout.py): the recorder stands
without its harness.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Figures:
    """What one family measured. `good` counts probes with the wanted outcome; each
    entry of `failures` is one line that reproduces a probe that did not get it.
    `skipped` says why the family could not run here (then tried is 0)."""

    family: str
    tried: int = 0
    good: int = 0
    failures: list[str] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # family-specific figures, by name
    skipped: str | None = None
    seconds: float = 0.0

    def add(self, ok: bool, repro: str) -> None:
        """Count one probe: good when `ok`, else its reproduction joins the failures."""
        self.tried += 1
        if ok:
            self.good += 1
        else:
            self.failures.append(repro)

    def as_dict(self) -> dict:
        return {
            "family": self.family,
            "tried": self.tried,
            "good": self.good,
            "failures": self.failures,
            "extra": self.extra,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 2),
        }
