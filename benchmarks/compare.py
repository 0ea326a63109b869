"""Two versions of the boundary side by side: `python -m benchmarks.compare REV [--against REV]`.

This machine's speed moves by a third within minutes (the host is shared), so a
figure from one run says little against one from another run. This runs two
source trees in one run, alternating round by round (the order flipped each
round), against one shared stub, and reports per tree:

- the boundary's event-loop CPU per call at 32 clients (its main thread's
  user + system time over the calls, from /proc): what throughput follows, and
  the least disturbed by what else runs;
- calls/s at 32 clients;
- the added latency of one client: the median of boundary calls minus the median
  of direct calls to the stub, the two alternating; and the same for the first
  event of a streamed call.

REV is a git revision, checked out in a temporary worktree that is removed
afterwards; it is compared with the working tree as it is, or with --against
REV. Each boundary runs from its own tree (that tree's docket and its
benchmarks._harness.boundary_main), with a durable ledger. The result is also
written to benchmarks/results/compare.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from benchmarks import _harness as h

TOKEN = "docket-compare-run-token"
CHAT = "/v1/chat/completions"
CONCURRENCY = 32


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.compare")
    parser.add_argument("rev", help="a git revision to compare (checked out in a temporary tree)")
    parser.add_argument("--against", help="another revision (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each running both trees")
    parser.add_argument("--calls", type=int, default=6000, help="calls at 32 clients per round")
    parser.add_argument("--pairs", type=int, default=400, help="latency pairs per round (0: none)")
    parser.add_argument(
        "--stream-pairs",
        type=int,
        default=100,
        help="streamed first-event pairs per round (0: none)",
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.calls < 100 or args.pairs < 0 or args.stream_pairs < 0:
        print(
            "compare: --rounds >= 1, --calls >= 100, --pairs and --stream-pairs >= 0",
            file=sys.stderr,
        )
        return 2
    with ExitStack() as stack:
        try:
            first = stack.enter_context(_worktree(args.rev))
            second = stack.enter_context(_worktree(args.against)) if args.against else h.ROOT
        except RuntimeError as exc:
            print(f"compare: {exc}", file=sys.stderr)
            return 2
        trees = {args.rev: first, args.against or "working tree": second}
        try:
            result = compare(
                trees,
                rounds=args.rounds,
                calls=args.calls,
                pairs=args.pairs,
                stream_pairs=args.stream_pairs,
            )
        except RuntimeError as exc:
            print(f"compare: {exc}", file=sys.stderr)
            return 1
    out = h.ROOT / "benchmarks" / "results" / "compare.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, figures in result["trees"].items():
        print(f"{name}:")
        for key, value in figures["summary"].items():
            print(f"   {key}: {value}")
    print(f"   -> {out}")
    return 0


class _worktree:
    """A detached git worktree of `rev` in a temporary folder, removed on exit."""

    def __init__(self, rev: str) -> None:
        self.rev = rev
        self.path = Path(tempfile.mkdtemp(prefix="docket-compare-"))

    def __enter__(self) -> Path:
        done = subprocess.run(
            ["git", "-C", str(h.ROOT), "worktree", "add", "--detach", str(self.path), self.rev],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            os.rmdir(self.path)
            problem = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
            raise RuntimeError(f"cannot check out {self.rev!r}: {problem}")
        return self.path

    def __exit__(self, *exc_info: object) -> None:
        subprocess.run(
            ["git", "-C", str(h.ROOT), "worktree", "remove", "--force", str(self.path)],
            capture_output=True,
            check=True,
        )


def _check_imports_from(tree: Path) -> None:
    """A boundary started for `tree` must run that tree's docket, not an installed one."""
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); import docket; print(docket.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tree, check=False
    ).stdout.strip()
    if not found.startswith(str(tree)):
        raise RuntimeError(f"a boundary for {tree} would import docket from {found or '?'}")


def compare(
    trees: dict[str, Path], *, rounds: int, calls: int, pairs: int, stream_pairs: int = 0
) -> dict:
    for tree in trees.values():
        _check_imports_from(tree)
    figures: dict[str, dict[str, list[float]]] = {
        name: {"loop_us": [], "calls_per_s": [], "added_ms": [], "first_event_ms": []}
        for name in trees
    }
    load_before = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(dir=os.environ.get("DOCKET_BENCH_DIR")) as folder,
        h.Stub() as stub,
    ):
        body = h.chat_body(stream=False)
        direct = h.request_bytes(stub.url, CHAT, TOKEN, body)
        for n in range(rounds):
            order = list(trees) if n % 2 == 0 else list(reversed(trees))
            for name in order:
                ledger = Path(folder) / f"round{n}-{order.index(name)}.jsonl"
                upstreams = {"openai": stub.url}
                with h.spawn_boundary(ledger, upstreams, TOKEN, tree=trees[name]) as boundary:
                    through = h.request_bytes(boundary.url, "/openai" + CHAT, TOKEN, body)
                    if pairs:
                        figures[name]["added_ms"].append(
                            _added_latency(boundary.url, through, stub.url, direct, pairs)
                        )
                    if stream_pairs:
                        figures[name]["first_event_ms"].append(
                            _added_first_event(boundary.url, stub.url, stream_pairs)
                        )
                    h.load(boundary.url, through, concurrency=CONCURRENCY, calls=500, timeout_s=120)
                    pid = boundary.process.pid
                    before = h.cpu_seconds(pid, pid)
                    ran = h.load(
                        boundary.url, through, concurrency=CONCURRENCY, calls=calls, timeout_s=300
                    )
                    loop_us = (h.cpu_seconds(pid, pid) - before) / calls * 1e6
                    if ran["non_200"]:
                        raise RuntimeError(f"{name}: answers other than 200: {ran['non_200']}")
                    figures[name]["loop_us"].append(round(loop_us, 1))
                    figures[name]["calls_per_s"].append(ran["calls_per_s"])
                    boundary.stop()
        stub.stop()
    return {
        "rounds": rounds,
        "calls": calls,
        "pairs": pairs,
        "load_average_before": load_before,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "trees": {name: {"rounds": f, "summary": _summary(f)} for name, f in figures.items()},
    }


def _added_latency(url: str, through: bytes, stub_url: str, direct: bytes, pairs: int) -> float:
    """Median boundary call minus median direct call, in ms, the two alternating."""
    paths = {"boundary": (h.Connection(url), through), "direct": (h.Connection(stub_url), direct)}
    took: dict[str, list[float]] = {"boundary": [], "direct": []}
    try:
        for i in range(pairs + 50):
            for name in ("boundary", "direct") if i % 2 else ("direct", "boundary"):
                conn, request = paths[name]
                status, seconds, answer = conn.call(request)
                if status != 200:
                    raise RuntimeError(f"{name} call answered {status}: {answer[:200]!r}")
                if i >= 50:  # the first calls warm both paths
                    took[name].append(seconds)
    finally:
        for conn, _ in paths.values():
            conn.close()
    return round((statistics.median(took["boundary"]) - statistics.median(took["direct"])) * 1e3, 3)


def _added_first_event(url: str, stub_url: str, pairs: int) -> float:
    """Median first SSE event through the boundary minus straight from the stub, in ms."""
    body = h.chat_body(stream=True)
    paths = {
        "boundary": (h.StreamConnection(url), "/openai" + CHAT),
        "direct": (h.StreamConnection(stub_url), CHAT),
    }
    first: dict[str, list[float]] = {"boundary": [], "direct": []}
    try:
        for i in range(pairs + 20):
            for name in ("boundary", "direct") if i % 2 else ("direct", "boundary"):
                conn, path = paths[name]
                timing = conn.call(path, TOKEN, body)
                if timing.status != 200:
                    raise RuntimeError(f"{name} stream answered {timing.status}")
                if i >= 20:
                    first[name].append(timing.first_body_s)
    finally:
        for conn, _ in paths.values():
            conn.close()
    return round(
        (statistics.median(first["boundary"]) - statistics.median(first["direct"])) * 1e3, 3
    )


def _summary(f: dict[str, list[float]]) -> dict[str, str]:
    def median(values: list[float]) -> str:
        return f"{statistics.median(values):.1f}" if values else "-"

    return {
        "event loop CPU us per call at c32 (median; rounds)": f"{median(f['loop_us'])}; {f['loop_us']}",
        "calls/s at c32 (median; rounds)": f"{median(f['calls_per_s'])}; {f['calls_per_s']}",
        "added latency p50 ms, one client (median; rounds)": (
            f"{median(f['added_ms'])}; {f['added_ms']}"
        ),
        "streamed first event added p50 ms (median; rounds)": (
            f"{median(f['first_event_ms'])}; {f['first_event_ms']}"
        ),
    }


if __name__ == "__main__":
    raise SystemExit(main())
