"""The boundary's memory over run length: does it grow with every event it records?

`nox -s soak` (or `python -m benchmarks.bench_soak --report DIR`). For each run
length (default 5,000, 10,000 and 30,000 calls: a 6x range), a fresh boundary
process with a fresh durable ledger, one shared stub, and 32 keep-alive
clients. The boundary's resident memory (VmRSS from /proc) is read after
start, after a warm-up, and after each tenth of the run; its peak (VmHWM) at
the end. Per run:

- growth after warm-up, and that growth per event recorded (two events a call);
- the slope of RSS against events over the run's checkpoints (least squares):
  bytes per event, over the whole run and over its second half. The first
  thousands of calls raise RSS by a megabyte or two (the allocator's pools,
  bounded caches filling) and then it stays flat: the whole-run slope of a
  short run shows that settling, the second half shows what keeps growing.

A boundary that kept something per call (an event, its line, a request's
body, a closed connection's state) would grow by at least the size of that
thing per event: a ledger line is ~450 bytes. The verdict compares the longest
run's second-half slope, and the growth between the shortest and longest runs' final RSS
per extra event, with MAX_BYTES_PER_EVENT, well under a line. The clients
reconnect at every checkpoint (new sockets), so connection churn is in it too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks import _harness as h
from benchmarks.bench_boundary import verify_ledger

TOKEN = "docket-soak-run-token"
PATH = "/openai/v1/chat/completions"
CONCURRENCY = 32
CHECKPOINTS = 10
LENGTHS = (5000, 10000, 30000)
WARMUP = 1000
MAX_BYTES_PER_EVENT = 50.0  # a retained ledger line would be ~450


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS (resident now) and VmHWM (the peak resident) of a process, in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    if len(out) != 2:
        raise RuntimeError(f"/proc/{pid}/status has no VmRSS/VmHWM: {out}")
    return out


def open_fds(pid: int) -> int:
    """How many file descriptors a process holds: each checkpoint's clients have hung up,
    so a socket the boundary failed to close would show here, run after run."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def slope(points: list[tuple[int, int]]) -> float | None:
    """Least-squares slope of y over x; None with fewer than two distinct x."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def one_run(stub: h.Stub, folder: Path, calls: int, warmup: int) -> dict:
    """A fresh boundary and ledger; `warmup` calls, then `calls` in CHECKPOINTS parts."""
    ledger = folder / f"ledger-{calls}.jsonl"
    boundary = h.spawn_boundary(ledger, {"openai": stub.url}, TOKEN)
    try:
        pid = boundary.process.pid
        request = h.request_bytes(boundary.url, PATH, TOKEN, h.chat_body(stream=False))
        started = memory_kib(pid)["VmRSS"]
        h.load(boundary.url, request, concurrency=CONCURRENCY, calls=warmup, timeout_s=600)
        base_events = boundary.stats()["count"]
        base = memory_kib(pid)["VmRSS"]
        points: list[dict] = [{"calls": 0, "events": 0, "rss_kib": base, "fds": open_fds(pid)}]
        done = 0
        cps = []
        for part in range(CHECKPOINTS):
            n = calls * (part + 1) // CHECKPOINTS - done
            result = h.load(boundary.url, request, concurrency=CONCURRENCY, calls=n, timeout_s=600)
            if result["non_200"]:
                raise RuntimeError(f"soak at {calls}: answers other than 200: {result['non_200']}")
            cps.append(result["calls_per_s"])
            done += n
            events = boundary.stats()["count"] - base_events
            rss = memory_kib(pid)["VmRSS"]
            points.append({"calls": done, "events": events, "rss_kib": rss, "fds": open_fds(pid)})
        end = memory_kib(pid)
        final = boundary.stop()
    finally:
        boundary.kill()
    on_disk = verify_ledger(ledger)
    ledger_bytes = ledger.stat().st_size
    ledger.unlink()  # the longest run's ledger is ~20 MB: not kept past its check
    made = warmup + calls
    for kind in ("model.request", "model.response"):
        if on_disk["types"].get(kind) != made:
            raise RuntimeError(f"ledger holds {on_disk['types'].get(kind)} {kind} for {made} calls")
    if final["stops"] or not final["complete"]:
        raise RuntimeError(f"the boundary asked to stop or lost evidence: {final}")
    events = points[-1]["events"]
    growth = (end["VmRSS"] - base) * 1024
    fit = slope([(p["events"], p["rss_kib"] * 1024) for p in points])
    # the second half alone: after the allocator's pools and the boundary's bounded
    # caches have filled, what is left is what grows with every event
    late = slope([(p["events"], p["rss_kib"] * 1024) for p in points[len(points) // 2 :]])
    return {
        "calls": calls,
        "warmup_calls": warmup,
        "events": events,
        "ledger_lines": on_disk["lines"],
        "ledger_bytes": ledger_bytes,
        "rss_kib": {"started": started, "after_warmup": base, "end": end["VmRSS"]},
        "peak_rss_kib": end["VmHWM"],
        "growth_after_warmup_bytes": growth,
        "growth_bytes_per_event": round(growth / events, 2) if events else None,
        "slope_bytes_per_event": round(fit, 2) if fit is not None else None,
        "second_half_slope_bytes_per_event": round(late, 2) if late is not None else None,
        "rss_bytes_per_event_at_end": round(end["VmRSS"] * 1024 / events, 1) if events else None,
        "checkpoints": points,
        "calls_per_s": {"min": min(cps), "max": max(cps)},
    }


def measure(lengths: tuple[int, ...] = LENGTHS, warmup: int = WARMUP) -> dict:
    load_before = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("DOCKET_BENCH_DIR")) as tmp:
        stub = h.Stub()
        try:
            for calls in lengths:
                runs.append(one_run(stub, Path(tmp), calls, warmup))
        finally:
            stub.kill()
    shortest, longest = runs[0], runs[-1]
    extra_events = longest["events"] - shortest["events"]
    across = (
        round((longest["rss_kib"]["end"] - shortest["rss_kib"]["end"]) * 1024 / extra_events, 2)
        if extra_events > 0
        else None
    )
    worst = max(abs(longest["second_half_slope_bytes_per_event"] or 0.0), abs(across or 0.0))
    return {
        "lengths": list(lengths),
        "concurrency": CONCURRENCY,
        "runs": runs,
        "across_runs_bytes_per_event": across,
        "max_bytes_per_event": MAX_BYTES_PER_EVENT,
        "flat": worst <= MAX_BYTES_PER_EVENT,
        "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
    }


def summary(result: dict) -> dict:
    out = {}
    for r in result["runs"]:
        out[f"{r['calls']:,} calls ({r['events']:,} events): RSS KiB after warm-up -> end"] = (
            f"{r['rss_kib']['after_warmup']:,} -> {r['rss_kib']['end']:,}, "
            f"slope {r['slope_bytes_per_event']} B/event, "
            f"second half {r['second_half_slope_bytes_per_event']}"
        )
    out["final RSS, shortest to longest run, per extra event (bytes)"] = result[
        "across_runs_bytes_per_event"
    ]
    out[f"flat (|B/event| <= {result['max_bytes_per_event']:g})"] = result["flat"]
    return out


def run(quick: bool) -> dict:
    """For `python -m benchmarks soak`."""
    result = measure((2000, 4000, 12000)) if quick else measure()
    result["summary"] = summary(result)
    return result


def report_md(result: dict, command: str) -> str:
    m = result["machine"]
    la = result["load_average"]
    lines = [
        f"# Soak: the boundary's memory over run length ({m['when']})",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {m['cpus']} cores, {m['platform']}, Python {m['python']}, {m['h11']}. "
        f"Load average (1/5/15 min) before: {'/'.join(f'{v:.2f}' for v in la['before'])}, "
        f"after: {'/'.join(f'{v:.2f}' for v in la['after'])}; other sessions' work shared "
        "the machine. Memory is what this measures, and it does not depend on the load.",
        "",
        f"Each run: a fresh boundary process with a fresh durable ledger, {result['concurrency']} "
        f"keep-alive clients (reconnecting at each of {CHECKPOINTS} checkpoints) against one "
        "stub; RSS from /proc/PID/status. Events are counted after the warm-up "
        "(two a call: model.request, model.response).",
        "",
        "| calls | events | ledger MB | RSS started KiB | after warm-up KiB | end KiB | "
        "peak KiB | growth B/event | slope B/event | second-half slope B/event | calls/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        rss = r["rss_kib"]
        lines.append(
            f"| {r['calls']:,} | {r['events']:,} | {r['ledger_bytes'] / 1e6:.1f} | "
            f"{rss['started']:,} | {rss['after_warmup']:,} | {rss['end']:,} | "
            f"{r['peak_rss_kib']:,} | {r['growth_bytes_per_event']} | "
            f"{r['slope_bytes_per_event']} | {r['second_half_slope_bytes_per_event']} | "
            f"{r['calls_per_s']['min']:,.0f}-{r['calls_per_s']['max']:,.0f} |"
        )
    longest = result["runs"][-1]
    lines += [
        "",
        f"RSS at each checkpoint of the longest run ({longest['calls']:,} calls), KiB: "
        + ", ".join(f"{p['rss_kib']:,}" for p in longest["checkpoints"])
        + "; its open file descriptors at the same points (the clients of the part before "
        "had hung up): " + ", ".join(str(p["fds"]) for p in longest["checkpoints"]) + ".",
        "",
        f"Final RSS from the shortest to the longest run, per extra event: "
        f"{result['across_runs_bytes_per_event']} bytes. A ledger line is "
        f"~{longest['ledger_bytes'] // max(1, longest['ledger_lines'])} bytes, so a boundary "
        f"that kept anything per event would show at least that. Verdict (|bytes per event| "
        f"<= {result['max_bytes_per_event']:g} for the longest run's second-half slope and "
        "across runs): "
        f"{'flat, memory does not grow per event' if result['flat'] else 'GROWS'}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_soak",
        description="The boundary's resident memory over runs of different lengths.",
    )
    parser.add_argument(
        "--lengths",
        default=",".join(str(n) for n in LENGTHS),
        help="calls in each run, comma-separated, shortest first (default %(default)s)",
    )
    parser.add_argument("--warmup", type=int, default=WARMUP, help="calls before the baseline")
    parser.add_argument("--out", default=str(h.ROOT / "benchmarks" / "results"))
    parser.add_argument("--report", help="also write soak.md and soak.json to this folder")
    args = parser.parse_args(argv)
    try:
        lengths = tuple(int(x) for x in args.lengths.split(","))
    except ValueError:
        print(f"bench_soak: --lengths wants integers, got {args.lengths!r}", file=sys.stderr)
        return 2
    if (
        len(lengths) < 2
        or any(n < CHECKPOINTS for n in lengths)
        or list(lengths) != sorted(lengths)
    ):
        print(
            f"bench_soak: --lengths wants two or more increasing counts >= {CHECKPOINTS}",
            file=sys.stderr,
        )
        return 2
    if args.warmup < 1:
        print("bench_soak: --warmup must be >= 1", file=sys.stderr)
        return 2
    command = h.how_run("soak", "benchmarks.bench_soak", argv or sys.argv[1:])
    folders = [Path(args.out), *([Path(args.report)] if args.report else [])]
    if not h.make_report_folders("bench_soak", folders):
        return 2
    from benchmarks.__main__ import machine

    result: dict = {"benchmark": "soak", "machine": machine()}
    try:
        result.update(measure(lengths, args.warmup))
    except (RuntimeError, OSError) as exc:
        print(f"bench_soak: {exc}", file=sys.stderr)
        return 1
    result["summary"] = summary(result)
    result["command"] = command
    md = report_md(result, command)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "soak.md").write_text(md)
    if args.report:
        folder = Path(args.report)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
        (folder / "soak.md").write_text(md)
    for key, value in result["summary"].items():
        print(f"   {key}: {value}")
    print(f"   -> {out / 'soak.md'}" + (f", {args.report}/soak.md" if args.report else ""))
    return 0 if result["flat"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
