"""`nox -s otel`: a game day's runs exported to a real Arize Phoenix, read back from its API.

    python -m chaos.phoenix FOLDER

starts `phoenix serve` (from the session's virtualenv, or $PHOENIX_BIN) on a free port of
127.0.0.1 with a working folder of its own, waits for /healthz, exports every run under
FOLDER (each folder holding a ledger.jsonl: a `docket game-day --keep` folder, or one run's)
twice with `docket export otel --no-metrics` (Phoenix answers /v1/metrics 405), reads the
spans back from its REST API, and stops it by its pid. Held, per run: one span per
model.request in its ledger plus the run's, every span once (the second export updated,
did not duplicate: the ids are derived), the run's span an AGENT at the root of its trace
and each call an LLM span whose parent is that run's span and whose token counts are the
ledger's. Any failure: one line, exit 1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

START_TIMEOUT = 120.0  # seconds for Phoenix to answer /healthz (it migrates a database first)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - loopback only
        return answer.read()


def wait_healthy(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"phoenix serve exited with {server.returncode} before answering")
        try:
            get(f"{url}/healthz")
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"phoenix did not answer {url}/healthz within {START_TIMEOUT:.0f} s")


def runs_under(folder: Path) -> tuple[list[Path], list[Path]]:
    """The run folders under `folder` (itself, if it holds a ledger), in name order: those
    with a receipt, and those without (a run whose recorder was killed, as in the
    supervisor-killed phase: its ledger has no session.end, which export refuses)."""
    found = sorted(p.parent for p in folder.rglob("ledger.jsonl"))
    return [r for r in found if (r / "receipt.json").is_file()], [
        r for r in found if not (r / "receipt.json").is_file()
    ]


def export_twice(run_dir: Path, url: str) -> None:
    for _ in range(2):
        subprocess.run(
            [sys.executable, "-m", "docket", "export", "otel", str(run_dir), "--endpoint", url,
             "--no-metrics"],
            check=True,
        )  # fmt: skip


def all_spans(url: str) -> list[dict]:
    """Every span of the default project, a page (Phoenix's largest, 1,000) at a time."""
    spans: list[dict] = []
    cursor = ""
    while True:
        page = json.loads(get(f"{url}/v1/projects/default/spans?limit=1000{cursor}"))
        spans += page["data"]
        if not page.get("next_cursor"):
            return spans
        cursor = f"&cursor={page['next_cursor']}"


def check(runs: list[Path], url: str) -> str:
    usage: dict[str, dict] = {}
    calls = 0
    for run_dir in runs:
        export_twice(run_dir, url)
        events = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
        usage |= {
            e["call_id"]: e.get("usage") or {} for e in events if e["type"] == "model.response"
        }
        calls += sum(1 for e in events if e["type"] == "model.request")
    want = calls + len(runs)  # a span per call, and one per run
    deadline = time.monotonic() + 30
    while True:  # Phoenix writes what it takes in the background
        spans = all_spans(url)
        if len(spans) >= want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    ids = [s["context"]["span_id"] for s in spans]
    if len(ids) != want or len(set(ids)) != len(ids):
        raise RuntimeError(
            f"{len(ids)} spans ({len(set(ids))} ids) for {calls} calls in {len(runs)} runs"
        )
    roots = {s["context"]["trace_id"]: s["context"]["span_id"] for s in spans if not s["parent_id"]}
    if len(roots) != len(runs) or {s["span_kind"] for s in spans if not s["parent_id"]} != {
        "AGENT"
    }:
        raise RuntimeError(f"{len(roots)} root spans for {len(runs)} runs, or a root not AGENT")
    for span in spans:
        if not span["parent_id"]:
            continue
        if span["span_kind"] != "LLM" or span["parent_id"] != roots.get(
            span["context"]["trace_id"]
        ):
            raise RuntimeError(f"span {span['name']}: not an LLM span under its run's span")
        a = span["attributes"]
        if a.get("docket.call_id") in usage:
            tokens = usage[a["docket.call_id"]]
            if a.get("llm.token_count.prompt") != tokens.get("input_tokens"):
                raise RuntimeError(f"span {span['name']}: prompt tokens {a!r} vs {tokens!r}")
    return (
        f"phoenix took {len(spans)} spans for {len(runs)} runs ({calls} calls), once each: "
        f"each run an AGENT trace root, each call an LLM span under it, token counts the ledger's"
    )


def main(argv: list[str]) -> int:
    runs, unended = runs_under(Path(argv[0]))
    if not runs:
        print(f"phoenix: no run with a receipt under {argv[0]}", file=sys.stderr)
        return 1
    for run in unended:
        print(f"phoenix: not exported (no receipt: its recorder was killed): {run}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="phoenix-") as work:
        env = {**os.environ, "PHOENIX_WORKING_DIR": work, "PHOENIX_HOST": "127.0.0.1",
               "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(free_port())}  # fmt: skip
        log = open(Path(work) / "phoenix.log", "wb")  # noqa: SIM115 - closed below
        server = subprocess.Popen(
            [
                os.environ.get("PHOENIX_BIN") or str(Path(sys.executable).parent / "phoenix"),
                "serve",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_healthy(url, server)
            print(check(runs, url))
            return 0
        except (RuntimeError, OSError, subprocess.CalledProcessError, KeyError) as exc:
            print(f"phoenix: {exc}", file=sys.stderr)
            return 1
        finally:
            server.terminate()
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
