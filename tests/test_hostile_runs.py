"""Inputs at the edge of what is accepted run to the end: a boundary on an IPv6
host, and a clock stepped by the largest step the grammar takes. Real runs, real
processes, bounded in time; each reads the ledger and receipt on disk."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import read_events

TIMEOUT = 120


def docket(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "docket", *args],
        cwd=cwd,
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


CHILD = """
import json, os, urllib.request
url = os.environ["DOCKET_BOUNDARY_URL"]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(url + "/docket/healthz", timeout=10) as answer:
    status = answer.status
print(json.dumps({"url": url, "openai": os.environ["OPENAI_BASE_URL"], "status": status}))
"""


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback (::1) on this host")
def test_a_boundary_on_an_ipv6_host_serves_and_the_child_reaches_it(tmp_path):
    """`[boundary] host = "::1"` was an internal error (the URL given to the child was
    http://::1:PORT); now the address is bracketed wherever a URL is built."""
    (tmp_path / "p.toml").write_text('[boundary]\nhost = "::1"\n', encoding="utf-8")
    (tmp_path / "child.py").write_text(CHILD, encoding="utf-8")
    result = docket(
        "run", "--policy", "p.toml", "--ledger-dir", "out", "--", sys.executable, "child.py",
        cwd=tmp_path,
    )  # fmt: skip
    err = result.stderr.decode()
    assert result.returncode == 0, err
    seen = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert seen["url"].startswith("http://[::1]:"), seen
    assert seen["openai"].startswith(seen["url"] + "/openai/"), seen
    assert seen["status"] == 200
    events = read_events(tmp_path / "out" / "ledger.jsonl")
    assert events[0]["type"] == "session.start" and events[-1]["type"] == "session.end"
    assert docket("verify", "out/receipt.json", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("step", ["-5256000m", "5256000m"])  # ten years, either way
def test_the_largest_clock_step_the_grammar_takes_runs_to_a_verified_receipt(tmp_path, step):
    """A step of 3.1e24 s was accepted, then the ledger could not stamp session.end
    (exit 70); durations are now bounded to ten years, and ten years works."""
    fault = f"clock:step({step})@seq 1"
    result = docket("chaos", "--seed", "1", "--dir", "out", "--fault", fault, cwd=tmp_path)
    err = result.stderr.decode()
    assert result.returncode == 0, err[-3000:]
    events = read_events(tmp_path / "out" / "ledger.jsonl")
    assert events[-1]["type"] == "session.end"
    start, end = int(events[0]["ts"][:4]), int(events[-1]["ts"][:4])
    assert abs(end - start) >= 9, (start, end)  # session.end is stamped in the stepped time
    assert docket("verify", "out/receipt.json", cwd=tmp_path).returncode == 0
