"""`nox -s otel`: a real run exported to a real Arize Phoenix, read back from its API.

    python -m chaos.phoenix RUN_DIR

starts `phoenix serve` (from the session's virtualenv, or $PHOENIX_BIN) on a free port of 127.0.0.1
with a working folder of its own, waits for /healthz, exports RUN_DIR twice with
`docket export otel --no-metrics` (Phoenix answers /v1/metrics 405), reads the spans
back from its REST API, and stops it by its pid. Held: one span per model.request
in the ledger plus the run's, every span once (the second export updated, did not
duplicate: the ids are derived), the run's span an AGENT and each call an LLM span
whose token counts are the ledger's. Any failure: one line, exit 1.
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


def check(run_dir: Path, url: str) -> str:
    for _ in range(2):
        subprocess.run(
            [sys.executable, "-m", "docket", "export", "otel", str(run_dir), "--endpoint", url,
             "--no-metrics"],
            check=True,
        )  # fmt: skip
    events = [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text().splitlines()]
    usage = {e["call_id"]: e.get("usage") or {} for e in events if e["type"] == "model.response"}
    requests = [e for e in events if e["type"] == "model.request"]
    deadline = time.monotonic() + 30
    while True:  # Phoenix writes what it takes in the background
        spans = json.loads(get(f"{url}/v1/projects/default/spans?limit=1000"))["data"]
        if len(spans) >= len(requests) + 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    ids = [s["context"]["span_id"] for s in spans]
    if len(ids) != len(requests) + 1 or len(set(ids)) != len(ids):
        raise RuntimeError(f"{len(ids)} spans ({len(set(ids))} ids) for {len(requests)} calls")
    kinds = sorted({s["span_kind"] for s in spans})
    if kinds != ["AGENT", "LLM"]:
        raise RuntimeError(f"span kinds {kinds}, not AGENT and LLM")
    for span in spans:
        a = span["attributes"]
        if span["parent_id"] and a.get("docket.call_id") in usage:
            tokens = usage[a["docket.call_id"]]
            if a.get("llm.token_count.prompt") != tokens.get("input_tokens"):
                raise RuntimeError(f"span {span['name']}: prompt tokens {a!r} vs {tokens!r}")
    return f"phoenix took {len(spans)} spans ({len(requests)} calls), once each, as AGENT and LLM"


def main(argv: list[str]) -> int:
    run_dir = Path(argv[0])
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
            print(check(run_dir, url))
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
