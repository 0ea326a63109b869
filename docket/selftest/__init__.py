"""`docket selftest`: an offline proof, in a few seconds, that Docket's mechanisms work here.

Each check is a small real run in this process: a boundary (docket.boundary.app)
on a real socket on 127.0.0.1 over a real ledger in a temporary folder, in front
of the selftest's own OpenAI-shaped upstream (upstream.py: docket/ never imports
the chaos harness), driven by an HTTP client as an agent would drive it; what it
judges is read back from the bytes on disk. No network, no keys, no child process.

The groups, one module each: checks_calls (recording, auth, the key swap, bad
input, redaction, egress, a streamed answer, the metrics), checks_guards (breaker, limiter, bulkhead, deadline),
checks_caps (reservations under concurrency, deny, kill, unpriced),
checks_evidence (a failed write disclosed or stopping the run, a clock step, a
receipt, a tampered byte, a torn tail, the committed vectors). runner.py runs
them; command.py prints them.
"""

from __future__ import annotations

from docket.selftest.checks_calls import calls
from docket.selftest.checks_caps import caps
from docket.selftest.checks_evidence import evidence
from docket.selftest.checks_guards import guards
from docket.selftest.runner import Check


def all_checks() -> list[Check]:
    return [*calls.checks, *guards.checks, *caps.checks, *evidence.checks]
