"""Many `docket run` processes under one fleet budget: the rig tests/test_fleet_runs.py
and benchmarks/bench_fleet.py share. Each run is its own boundary (its own process,
ledger and receipt) with the reference agent hammering it with concurrent callers,
against one stub provider and one budget in a real PostgreSQL."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

STUB_KEY = "sk-real-upstream-key-fleet-0a1b2c3d"


@dataclass(frozen=True)
class RunResult:
    folder: Path
    returncode: int
    stderr: str

    def receipt(self) -> dict:
        return json.loads((self.folder / "receipt.json").read_text())

    def spent_nusd(self) -> int:
        """What the run's receipt says it spent (its ledger's charges)."""
        return int(self.receipt()["totals"]["cost_nusd"])

    def events(self, type_: str) -> list[dict]:
        lines = (self.folder / "ledger.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e.get("type") == type_]


def write_policy(path: Path, stub_url: str, dsn: str, budget: str, **fleet: object) -> Path:
    keys = {"budget": budget, "dsn": dsn, "lease_seconds": 10, "timeout": 1, **fleet}
    table = "\n".join(f"{k} = {json.dumps(v)}" for k, v in keys.items())
    path.write_text(
        f'[providers.openai]\nkind = "openai"\nbase_url = "{stub_url}"\nkey_env = "STUB_KEY"\n'
        f"[fleet]\n{table}\n"
    )
    return path


def run_argv(policy: Path, folder: Path, *, calls: int, concurrency: int) -> list[str]:
    return [
        sys.executable, "-m", "docket", "run", "--policy", str(policy), "--ledger-dir",
        str(folder), "--", sys.executable, "-m", "docket", "agent", "--mode", "hammer",
        "--calls", str(calls), "--concurrency", str(concurrency),
    ]  # fmt: skip


def run_env() -> dict[str, str]:
    return {**os.environ, "STUB_KEY": STUB_KEY}
