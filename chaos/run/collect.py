"""A chaos run's result, read back from the files the run left in its folder.

Reading from disk, not from the engine's memory, is what lets a run whose
recorder was killed outright (no receipt, no outcome.json) be reported the
same way, and it means the result is what a later reader would also see.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from docket.errors import InputError
from docket.ledger.reader import iter_lines

NOTES = "notes.txt"  # the engine's notes on the run (others' proxies, teardown), one a line

# Every way the boundary refuses a call, by the ledger event it writes, and the name
# the agent sees it by (its docket_* error type); a policy refusal is named by its rule
# (caps.max_usd, egress ...), which says more than docket_policy_denied.
REFUSALS = {
    "policy.denied": "docket_policy_denied",
    "x-docket.breaker-open": "docket_breaker_open",
    "x-docket.rate-limited": "docket_rate_limited",
    "load.shed": "docket_load_shed",
}


def refusals_by_rule(events) -> dict[str, int]:
    """Refused calls per rule: a policy refusal by its `rule`, any other by its error type."""
    out: dict[str, int] = {}
    for event in events:
        kind = event.get("type")
        if kind in REFUSALS:
            rule = (
                str(event.get("rule") or REFUSALS[kind])
                if kind == "policy.denied"
                else REFUSALS[kind]
            )
            out[rule] = out.get(rule, 0) + 1
    return dict(sorted(out.items()))


@dataclass
class RunResult:
    seed: int
    schedule: list[str]  # the canonical fault texts, in order
    exit_status: int  # the supervised run's (42 = cap kill, 43 = evidence lost, ...)
    reason: str
    folder: Path
    ledger_path: Path
    receipt_path: Path
    receipt: dict  # {} when no receipt was written (the recorder was killed)
    events: list[dict]
    stub_logs: dict[str, list[dict]]
    metrics: str  # Prometheus text scraped before the boundary stopped ("" if none)
    probes: list[dict]
    agent_reports: dict[str, dict | None]
    injected: list[dict]
    duration_s: float
    repro: str
    notes: list[str] = field(default_factory=list)  # what could not be collected, and why
    agent_pids: dict[str, int] = field(default_factory=dict)  # from agents/NAME.pid
    # a signal the supervisor caught that the harness did not send (the user's Ctrl-C)
    interrupted_by: str | None = None

    def evidence(self) -> dict:
        """Everything, as one JSON-able dict (metrics parsed: sample name{labels} -> value)."""
        return {
            "events": self.events,
            "receipt": self.receipt,
            "metrics": parse_metrics(self.metrics),
            "stubs": self.stub_logs,
            "probes": self.probes,
            "agents": self.agent_reports,
            "injected": self.injected,
            "exit_status": self.exit_status,
            "seed": self.seed,
            "agent_pids": self.agent_pids,
        }

    def summary(self) -> dict:
        """The receipt's headline, for a terminal: calls, outcomes, faults, exit and why."""
        types: dict[str, int] = {}
        for event in self.events:
            types[event["type"]] = types.get(event["type"], 0) + 1
        faults = self.receipt.get("faults") or {}
        return {
            "calls": types.get("model.request", 0),
            "ok": types.get("model.response", 0),
            "errors": types.get("model.error", 0),
            "refused": sum(types.get(kind, 0) for kind in REFUSALS),
            "refused_by_rule": refusals_by_rule(self.events),
            "faults_injected": faults.get("injected", types.get("fault.injected", 0)),
            "faults_performed": len(self.injected),
            "ledger_complete": ((self.receipt.get("ops") or {}).get("evidence") or {}).get(
                "ledger_complete"
            ),
            "exit_status": self.exit_status,
            "reason": self.reason,
        }


def parse_metrics(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def read_jsonl(path: Path, notes: list[str]) -> list[dict]:
    """The JSON objects of a harness log, one a line.

    A last line without its newline was never finished (its writer was killed
    mid-write): it is left out and `notes` says so. Any other line that is not
    a JSON object means the file is not what the harness wrote: InputError
    naming the file and the line.
    """
    if not path.exists():
        return []
    out = []
    for number, line in enumerate(iter_lines(path), start=1):
        if not line.complete:
            notes.append(
                f"{path.name}: line {number} is torn ({len(line.data)} bytes without a "
                "newline: its writer stopped mid-line); left out"
            )
            break
        if not line.data.strip():
            continue
        try:
            value = json.loads(line.data)
        except ValueError as exc:  # UnicodeDecodeError is one
            raise InputError(f"{path}:{number}: not a JSON line ({exc})") from None
        if not isinstance(value, dict):
            raise InputError(f"{path}:{number}: not a JSON object")
        out.append(value)
    return out


def read_agent_pids(folder: Path, notes: list[str]) -> dict[str, int]:
    """agents/NAME.pid, written by the launcher before each agent runs: name -> pid."""
    pids = {}
    for path in sorted((folder / "agents").glob("*.pid")):
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        if text.isdigit() and int(text) > 1:
            pids[path.stem] = int(text)
        else:
            notes.append(f"agents/{path.name}: {text[:40]!r} is not a pid")
    return pids


def read_ledger(path: Path) -> list[dict]:
    """The complete lines of a ledger, parsed (a torn tail, after a kill, is left out)."""
    if not path.exists():
        return []
    return [json.loads(line.data) for line in iter_lines(path) if line.complete]


def last_json_line(path: Path) -> dict | None:
    """An agent's report: the last line of its stdout that is a JSON object."""
    if not path.exists():
        return None
    for line in reversed(path.read_text(encoding="utf-8", errors="replace").splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def collect(
    folder: Path,
    *,
    seed: int,
    schedule: list[str],
    repro: str,
    agents: list[str],
    duration_s: float,
    killed: tuple[int, str] | None = None,
) -> RunResult:
    """Build the RunResult from `folder`. `killed` is (status, reason) for a run whose
    supervisor died without writing outcome.json."""
    notes = []
    outcome_path = folder / "outcome.json"
    if outcome_path.exists():
        outcome = json.loads(outcome_path.read_text())
        exit_status, reason = outcome["exit_status"], outcome["reason"]
        interrupted_by = outcome.get("interrupted_by")
    elif killed is not None:
        (exit_status, reason), interrupted_by = killed, None
    else:
        exit_status, reason, interrupted_by = 70, "the run ended without an outcome", None
    receipt_path = folder / "receipt.json"
    receipt = json.loads(receipt_path.read_text()) if receipt_path.exists() else {}
    if not receipt:
        notes.append("no receipt: the recorder did not finish")
    metrics_path = folder / "metrics.txt"
    metrics = metrics_path.read_text() if metrics_path.exists() else ""
    error = folder / "metrics.error"
    if error.exists():
        notes.append(f"metrics not scraped: {error.read_text().strip()}")
    notes_path = folder / NOTES
    if notes_path.exists():
        notes += notes_path.read_text(encoding="utf-8", errors="replace").splitlines()
    stub_logs = {
        path.name.removeprefix("stub-").removesuffix(".jsonl"): read_jsonl(path, notes)
        for path in sorted(folder.glob("stub-*.jsonl"))
    }
    return RunResult(
        seed=seed,
        schedule=schedule,
        exit_status=exit_status,
        reason=reason,
        folder=folder,
        ledger_path=folder / "ledger.jsonl",
        receipt_path=receipt_path,
        receipt=receipt,
        events=read_ledger(folder / "ledger.jsonl"),
        stub_logs=stub_logs,
        metrics=metrics,
        probes=read_jsonl(folder / "probes.jsonl", notes),
        agent_reports={name: last_json_line(folder / "agents" / f"{name}.out") for name in agents},
        injected=read_jsonl(folder / "injected.jsonl", notes),
        duration_s=duration_s,
        repro=repro,
        notes=notes,
        agent_pids=read_agent_pids(folder, notes),
        interrupted_by=interrupted_by,
    )
