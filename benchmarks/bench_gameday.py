"""The game day's wall time: all nine phases, as `docket game-day` runs them (target <= 90 s).

Runs the phases in this process (the runner's own `game_day`, one trio run, in
order, each in its own temporary folder) and reports the total and each phase's
wall time, with its verdict: a time is only a figure for a phase that passed.
`quick` runs the three fastest phases instead of all nine (a smoke run).
"""

from __future__ import annotations

import time

TARGET_S = 90.0
QUICK = ("runaway-loop", "ledger-pressure", "upstream-failure")


def run(quick: bool) -> dict:
    from chaos.gameday.phase import load_phases
    from chaos.gameday.runner import game_day

    phases = load_phases(QUICK if quick else ())
    started = time.monotonic()
    cpu = time.process_time()
    result = game_day(phases)
    wall = time.monotonic() - started
    per_phase = {
        p.name: {
            "wall_s": round(p.duration_s, 2),
            "verdict": p.verdict,
            "runs": {r.name: round(r.duration_s, 2) for r in p.runs},  # a phase may hold several
        }
        for p in result.phases
    }
    summary = {
        "phases": len(result.phases),
        "verdict": result.verdict,
        "total_wall_s": round(wall, 2),
        "target_s": TARGET_S,
        "within_target": wall <= TARGET_S,
        "harness_cpu_s": round(time.process_time() - cpu, 2),  # this process only, not the children
    }
    summary.update({f"{name}_s": v["wall_s"] for name, v in per_phase.items()})
    return {"summary": summary, "phases": per_phase}
