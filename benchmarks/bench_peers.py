"""Docket's boundary against LiteLLM's proxy, over one stub, in one run.

`nox -s peers` (or `python -m benchmarks.bench_peers --report DIR` where
litellm is installed). Four processes on 127.0.0.1: one stub provider
(`docket stub --kind openai`), Docket's boundary with its ledger durable (as
bench_boundary.py starts it), LiteLLM's proxy routed to the same stub
(benchmarks/_litellm.py), and this client. Measured:

- added latency, one client: a call through Docket, one through LiteLLM and
  one straight to the stub, in turn (the order rotates every round), so drift on
  this shared machine hits all three alike. Added = a path's percentile minus
  the direct path's.
- calls/s at 32 keep-alive clients, each path in every round (order rotated);
  the median round per path. LiteLLM serves far fewer calls a second, so it is
  given fewer calls a round (--peer-calls) to keep rounds of similar length.
- Docket's own latency p50/p95/p99/p99.9 at 1, 8 and 32 clients, each level
  beside the same load straight to the stub.

The ratios are what carries across machines: the absolute figures move with
what else runs (the load average is recorded before and after). Without
LiteLLM installed, Docket is measured alone and the report says why. At the end
Docket's ledger is read back from disk: a request and a response per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks import _harness as h
from benchmarks import _litellm
from benchmarks.bench_boundary import verify_ledger

TOKEN = "docket-peers-run-token"
CHAT = "/v1/chat/completions"
LEVELS = (1, 8, 32)
CONCURRENCY = 32
SERVER = {"direct": "stub", "docket": "docket", "litellm": "litellm"}  # who serves each path
QUANTILES = ("p50", "p95", "p99", "p99.9")


class Route:
    """One way to the stub: its URL, request path and bearer token."""

    def __init__(self, url: str, path: str, token: str) -> None:
        self.url, self.path, self.token = url, path, token

    def request(self) -> bytes:
        return h.request_bytes(self.url, self.path, self.token, h.chat_body(stream=False))


def rotations(names: list[str], i: int) -> list[str]:
    """Round i's order: every rotation of `names`, forwards then backwards, in turn,
    so each path goes first, middle and last equally often."""
    k = i % len(names)
    order = names[k:] + names[:k]
    return order if (i // len(names)) % 2 == 0 else order[::-1]


def added_latency(paths: dict[str, Route], rounds: int, warmup: int) -> dict:
    conns = {name: h.Connection(p.url) for name, p in paths.items()}
    requests = {name: p.request() for name, p in paths.items()}
    samples: dict[str, list[float]] = {name: [] for name in paths}
    paired: dict[str, list[float]] = {name: [] for name in paths if name != "direct"}
    names = list(paths)
    try:
        for i in range(warmup + rounds):
            took = {}
            for name in rotations(names, i):
                status, seconds, answer = conns[name].call(requests[name])
                if status != 200:
                    raise RuntimeError(f"{name} call answered {status}: {answer[-300:]!r}")
                took[name] = seconds
            if i >= warmup:
                for name, seconds in took.items():
                    samples[name].append(seconds)
                for name in paired:
                    paired[name].append(took[name] - took["direct"])
    finally:
        for conn in conns.values():
            conn.close()
    ms = {name: h.percentiles(s) for name, s in samples.items()}
    return {
        "rounds": rounds,
        "latency_ms": ms,
        "added_ms": {
            name: {q: round(ms[name][q] - ms["direct"][q], 3) for q in ("p50", "p90", "p99")}
            for name in paired
        },
        "paired_difference_ms": {name: h.percentiles(d) for name, d in paired.items()},
        "calls": {name: warmup + rounds for name in paths},
    }


def cpu_of(pids: dict[str, int]) -> dict[str, float]:
    return {name: h.cpu_seconds(pid) for name, pid in pids.items()}


def throughput(
    paths: dict[str, Route], calls: dict[str, int], rounds: int, pids: dict[str, int]
) -> dict:
    """Each path under 32 clients once a round (order rotated); the median round by calls/s.
    CPU per call of each server process over its own load, from /proc."""
    runs: dict[str, list[dict]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(rounds):
        for name in rotations(names, i):
            before = cpu_of(pids)
            result = h.load(
                paths[name].url,
                paths[name].request(),
                concurrency=CONCURRENCY,
                calls=calls[name],
                timeout_s=600,
            )
            after = cpu_of(pids)
            if result["non_200"]:
                raise RuntimeError(f"{name} at {CONCURRENCY} clients: not 200: {result['non_200']}")
            result["cpu_us_per_call"] = {
                who: round((after[who] - before[who]) / calls[name] * 1e6) for who in pids
            }
            runs[name].append(result)
    median = {
        name: sorted(rs, key=lambda r: r["calls_per_s"])[len(rs) // 2] for name, rs in runs.items()
    }
    return {
        "concurrency": CONCURRENCY,
        "rounds": rounds,
        "median": median,
        "calls_per_s_all": {name: [r["calls_per_s"] for r in rs] for name, rs in runs.items()},
        "server_cpu_us_per_call": {
            name: [r["cpu_us_per_call"][SERVER[name]] for r in rs] for name, rs in runs.items()
        },
        "calls": {name: calls[name] * rounds for name in paths},
    }


def docket_levels(paths: dict[str, Route], calls: int) -> dict:
    """Docket and direct at 1, 8 and 32 clients, alternating at each level."""
    out: dict[str, dict] = {}
    for level in LEVELS:
        n = max(calls // (4 if level == 1 else 1), level * 4)
        row = {}
        for name in ("direct", "docket") if level % 2 else ("docket", "direct"):
            result = h.load(
                paths[name].url, paths[name].request(), concurrency=level, calls=n, timeout_s=600
            )
            if result["non_200"]:
                raise RuntimeError(f"{name} at {level} clients: not 200: {result['non_200']}")
            row[name] = result
        out[str(level)] = row
    return out


@dataclass(frozen=True)
class Sizes:
    rounds: int  # throughput rounds at 32 clients, every path in each
    pairs: int  # latency rounds at one client, every path in each
    calls: int  # calls a round at 32 clients, Docket and direct
    peer_calls: int  # calls a round at 32 clients, LiteLLM
    level_calls: int  # calls at each of 1 (a quarter of it), 8 and 32 clients


FULL = Sizes(rounds=5, pairs=1000, calls=5000, peer_calls=600, level_calls=6000)
QUICK = Sizes(rounds=1, pairs=200, calls=1000, peer_calls=200, level_calls=1000)


def measure(sizes: Sizes, *, with_litellm: bool = True, folder: Path | None = None) -> dict:
    """The whole comparison; every process it starts is stopped before it returns."""
    rounds, pairs, calls = sizes.rounds, sizes.pairs, sizes.calls
    peer_calls, level_calls = sizes.peer_calls, sizes.level_calls
    executable, where = _litellm.find_litellm() if with_litellm else (None, "not asked for")
    peer: dict = {"executable": executable, "found": where}
    if executable:
        peer["version"] = _litellm.litellm_version(executable)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(dir=folder or os.environ.get("DOCKET_BENCH_DIR")) as tmp:
        ledger = Path(tmp) / "ledger.jsonl"
        speed_before = h.python_speed_probe()
        disk = h.fdatasync_probe(Path(tmp), 100)
        stub = h.Stub()
        boundary: h.BoundaryProcess | None = None
        litellm: _litellm.LiteLLMProxy | None = None
        try:
            boundary = h.spawn_boundary(ledger, {"openai": stub.url}, TOKEN)
            paths = {
                "direct": Route(stub.url, CHAT, TOKEN),
                "docket": Route(boundary.url, "/openai" + CHAT, TOKEN),
            }
            pids = {"stub": stub.process.pid, "docket": boundary.process.pid}
            if executable:
                litellm = _litellm.LiteLLMProxy(executable, stub.url, Path(tmp))
                paths["litellm"] = Route(litellm.url, _litellm.CHAT_PATH, _litellm.MASTER_KEY)
                pids["litellm"] = litellm.process.pid
            latency = added_latency(paths, pairs, warmup=max(20, pairs // 20))
            per_path = {name: calls for name in paths}
            if "litellm" in paths:
                per_path["litellm"] = peer_calls
            load = throughput(paths, per_path, rounds, pids)
            levels = docket_levels(paths, level_calls)
            final = boundary.stop()
        finally:
            if litellm is not None:
                litellm.stop()
            if boundary is not None:
                boundary.kill()
            stub.kill()
        on_disk = verify_ledger(ledger)
    load_after = os.getloadavg()
    made = (
        latency["calls"]["docket"]
        + load["calls"]["docket"]
        + sum(row["docket"]["calls"] for row in levels.values())
    )
    for kind in ("model.request", "model.response"):
        if on_disk["types"].get(kind) != made:
            raise RuntimeError(f"ledger holds {on_disk['types'].get(kind)} {kind} for {made} calls")
    if final["stops"] or not final["complete"]:
        raise RuntimeError(f"the boundary asked to stop or lost evidence: {final}")
    if not executable:
        peer["skipped"] = where
    return {
        "processes": "stub | Docket boundary | LiteLLM proxy | client, unpinned, 127.0.0.1",
        "peer": peer,
        "latency": latency,
        "throughput": load,
        "docket_levels": levels,
        "ratios": ratios(latency, load),
        "ledger": {"on_disk": on_disk, "final": final, "calls": made},
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "disk_fdatasync_ms_before": disk,
        "python_speed_us_before": speed_before,
        "sizes": asdict(sizes),
    }


def ratios(latency: dict, load: dict) -> dict:
    """LiteLLM's figure over Docket's (added latency), Docket's over LiteLLM's (calls/s)."""
    added = latency["added_ms"]
    if "litellm" not in added:
        return {}
    out: dict = {}
    for q in ("p50", "p99"):
        d, p = added["docket"][q], added["litellm"][q]
        out[f"added_{q}_litellm_over_docket"] = round(p / d, 1) if d > 0 else None
    d_cps = load["median"]["docket"]["calls_per_s"]
    p_cps = load["median"]["litellm"]["calls_per_s"]
    out["calls_per_s_docket_over_litellm"] = round(d_cps / p_cps, 1) if p_cps else None
    # Round by round (the two ran minutes apart at most): steadier than medians taken
    # from different rounds when the machine's speed moves under the run.
    per_round = [
        round(d / p, 1)
        for d, p in zip(
            load["calls_per_s_all"]["docket"], load["calls_per_s_all"]["litellm"], strict=True
        )
        if p
    ]
    out["calls_per_s_docket_over_litellm_each_round"] = per_round
    out["calls_per_s_docket_over_litellm_median_of_rounds"] = median(per_round)
    # Each server's own CPU per call: the figure that moves least with the machine's load.
    cpu = load["server_cpu_us_per_call"]
    d_cpu, p_cpu = median(cpu["docket"]), median(cpu["litellm"])
    out["server_cpu_per_call_litellm_over_docket"] = (
        round(p_cpu / d_cpu, 1) if d_cpu and p_cpu is not None else None
    )
    return out


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def summary(result: dict) -> dict:
    lat, load = result["latency"], result["throughput"]["median"]
    out = {}
    for name in lat["added_ms"]:
        a = lat["added_ms"][name]
        out[f"{name} added latency p50/p99 ms (1 client)"] = f"{a['p50']}/{a['p99']}"
    for name, r in load.items():
        out[f"{name} calls/s at {CONCURRENCY} clients"] = r["calls_per_s"]
    for key, value in result["ratios"].items():
        out[key] = value
    if "skipped" in result["peer"]:
        out["LiteLLM"] = f"not measured: {result['peer']['skipped']}"
    return out


def run(quick: bool) -> dict:
    """For `python -m benchmarks peers`."""
    result = measure(QUICK if quick else FULL)
    result["summary"] = summary(result)
    return result


# ---------------------------------------------------------------- the report


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}" if isinstance(x, float) else f"{x:,}"


def report_md(result: dict, command: str) -> str:
    """The load report, in markdown, from one result."""
    m = result["machine"]
    lat, tp = result["latency"], result["throughput"]
    peer = result["peer"]
    names = list(lat["latency_ms"])
    lines = [
        f"# Load: Docket's boundary beside LiteLLM's proxy ({m['when']})",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {m['cpus']} cores, {m['platform']}, Python {m['python']}, {m['h11']}. "
        f"Load average (1/5/15 min) before: {_loadavg(result['load_average']['before'])}, "
        f"after: {_loadavg(result['load_average']['after'])}. Other work shared the machine "
        "during the run (other sessions' builds and tests), so absolute figures are "
        "lower than on a quiet machine: the ratios, measured side by side in one run, are "
        "what counts.",
        "",
        f"Processes: {result['processes']}. Docket's ledger was durable (fdatasync; the disk's "
        f"write+fdatasync p50 before the run: {result['disk_fdatasync_ms_before']['p50']} ms). "
        + (
            f"LiteLLM {peer.get('version')} (`litellm[proxy]` from PyPI), one worker, "
            "master key, no database, no callbacks, telemetry off, local price map."
            if "skipped" not in peer
            else f"LiteLLM not measured: {peer['skipped']}."
        ),
        "",
        "## Added latency, one client (calls in turn, order rotating each round)",
        "",
        f"{lat['rounds']} rounds after warm-up. Added = the path's percentile minus the "
        "direct path's.",
        "",
        "| path | p50 ms | p90 ms | p99 ms | added p50 ms | added p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        ms = lat["latency_ms"][name]
        added = lat["added_ms"].get(name, {"p50": None, "p99": None})
        lines.append(
            f"| {name} | {ms['p50']} | {ms['p90']} | {ms['p99']} | "
            f"{fmt(added['p50'])} | {fmt(added['p99'])} |"
        )
    lines += [
        "",
        f"## Throughput at {tp['concurrency']} clients",
        "",
        f"{tp['rounds']} rounds, every path in each (order rotating); the median round by "
        "calls/s. CPU per call: each server process's CPU (from /proc) over that path's load.",
        "",
        "| path | calls a round | calls/s (median) | all rounds | p50 ms | p99 ms | "
        "server CPU us/call |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        r = tp["median"][name]
        server = SERVER[name]
        lines.append(
            f"| {name} | {r['calls']:,} | {fmt(r['calls_per_s'])} | "
            f"{', '.join(fmt(x) for x in tp['calls_per_s_all'][name])} | "
            f"{r['latency_ms']['p50']} | {r['latency_ms']['p99']} | "
            f"{r['cpu_us_per_call'].get(server, '-')} |"
        )
    if result["ratios"]:
        r = result["ratios"]
        lines += [
            "",
            "## The peer ratio",
            "",
            f"- LiteLLM adds {fmt(r['added_p50_litellm_over_docket'])}x Docket's added "
            f"latency at p50 and {fmt(r['added_p99_litellm_over_docket'])}x at p99.",
            f"- Docket serves {fmt(r['calls_per_s_docket_over_litellm'])}x LiteLLM's calls/s "
            f"at {tp['concurrency']} clients (median rounds); round by round "
            f"{', '.join(fmt(x) for x in r['calls_per_s_docket_over_litellm_each_round'])}x "
            f"(median {fmt(r['calls_per_s_docket_over_litellm_median_of_rounds'])}x).",
            f"- LiteLLM's process spends {fmt(r['server_cpu_per_call_litellm_over_docket'])}x "
            "the CPU a call that Docket's boundary does (median of rounds): the steadiest "
            "of these figures on a shared machine.",
        ]
    lines += [
        "",
        "## Docket at 1, 8 and 32 clients",
        "",
        "Each level: the same load through Docket and straight to the stub, one after the other.",
        "",
        "| clients | path | calls | calls/s | p50 ms | p95 ms | p99 ms | p99.9 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for level, row in result["docket_levels"].items():
        for name in ("docket", "direct"):
            r = row[name]
            q = r["latency_ms"]
            lines.append(
                f"| {level} | {name} | {r['calls']:,} | {fmt(r['calls_per_s'])} | "
                + " | ".join(str(q[k]) for k in QUANTILES)
                + " |"
            )
    ledger = result["ledger"]
    lines += [
        "",
        f"Docket's ledger read back from disk afterwards: {ledger['on_disk']['lines']:,} lines, "
        f"chain valid, a model.request and a model.response for each of its "
        f"{ledger['calls']:,} calls.",
        "",
    ]
    return "\n".join(lines)


def _loadavg(values: list[float]) -> str:
    return "/".join(f"{v:.2f}" for v in values)


def write_report(result: dict, folder: Path, stem: str, command: str, md: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    result = {**result, "command": command}
    (folder / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (folder / f"{stem}.md").write_text(md)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_peers",
        description="Docket's boundary beside LiteLLM's proxy over one stub, in one run.",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--rounds", type=int, help=f"throughput rounds (default {FULL.rounds})")
    parser.add_argument("--pairs", type=int, help="latency rounds at one client")
    parser.add_argument("--calls", type=int, help="calls a round at 32 clients, Docket and direct")
    parser.add_argument("--peer-calls", type=int, help="calls a round at 32 clients, LiteLLM")
    parser.add_argument("--level-calls", type=int, help="calls at each of 1, 8, 32 clients")
    parser.add_argument("--no-litellm", action="store_true", help="measure Docket alone")
    parser.add_argument("--out", default=str(h.ROOT / "benchmarks" / "results"))
    parser.add_argument("--report", help="also write load.md and load.json to this folder")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    for key in asdict(sizes):
        value = getattr(args, key)
        if value is not None:
            if value < 1:
                print(f"bench_peers: --{key.replace('_', '-')} must be >= 1", file=sys.stderr)
                return 2
            sizes = replace(sizes, **{key: value})
    command = h.how_run("peers", "benchmarks.bench_peers", argv or sys.argv[1:])
    folders = [Path(args.out), *([Path(args.report)] if args.report else [])]
    if not h.make_report_folders("bench_peers", folders):
        return 2
    from benchmarks.__main__ import machine

    result: dict = {"benchmark": "peers", "machine": machine()}
    try:
        result.update(measure(sizes, with_litellm=not args.no_litellm))
    except (RuntimeError, OSError) as exc:
        print(f"bench_peers: {exc}", file=sys.stderr)
        return 1
    result["summary"] = summary(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md = report_md(result, command)
    write_report(result, out, "peers", command, md)
    if args.report:
        write_report(result, Path(args.report), "load", command, md)
    for key, value in result["summary"].items():
        print(f"   {key}: {value}")
    print(f"   -> {out / 'peers.md'}" + (f", {args.report}/load.md" if args.report else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
