"""The peers and soak benchmarks (`nox -s peers`, `nox -s soak`) run end to end on a tiny count.

Real processes on 127.0.0.1 (a stub, a boundary with a durable ledger), each script in a
subprocess bounded in time; the figures are not judged here (this machine is shared), the
reports are: every section there, counts that add up, the ledger read back. LiteLLM is not
a dependency: the script measures Docket alone and says why, and the one test that would
start LiteLLM skips with that reason where it is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import _litellm, bench_peers, bench_soak

ROOT = Path(__file__).resolve().parent.parent

TINY_PEERS = ["--pairs", "20", "--calls", "64", "--peer-calls", "16", "--rounds", "1"]
TINY_PEERS += ["--level-calls", "64"]


def run_script(module: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_peers_measures_docket_alone_and_names_why(tmp_path: Path) -> None:
    out, report = tmp_path / "out", tmp_path / "report"
    done = run_script(
        "benchmarks.bench_peers", "--no-litellm", *TINY_PEERS, "--out", str(out),
        "--report", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads((report / "load.json").read_text())
    assert result["peer"]["skipped"] == "not asked for"
    assert set(result["latency"]["latency_ms"]) == {"direct", "docket"}
    assert result["latency"]["latency_ms"]["docket"]["n"] == 20
    assert set(result["docket_levels"]) == {"1", "8", "32"}
    for level in result["docket_levels"].values():
        for path in ("docket", "direct"):
            assert set(bench_peers.QUANTILES) <= set(level[path]["latency_ms"])
    # every call the client made through Docket is on disk, as a request and a response
    ledger = result["ledger"]
    assert ledger["on_disk"]["types"]["model.request"] == ledger["calls"]
    assert ledger["on_disk"]["types"]["model.response"] == ledger["calls"]
    # latency (+ warm-up), load, levels (1 client: a quarter; 32: at least 4 calls each)
    assert ledger["calls"] == (20 + 20) + 64 + (16 + 64 + 128)
    md = (report / "load.md").read_text()
    assert "LiteLLM not measured: not asked for" in md
    assert "| 32 | docket |" in md
    assert (out / "peers.json").exists() and (out / "peers.md").exists()
    assert result["command"].startswith("python -m benchmarks.bench_peers --no-litellm")


def test_peers_with_litellm_when_installed(tmp_path: Path) -> None:
    executable, why = _litellm.find_litellm()
    if executable is None:
        pytest.skip(why)
    done = run_script("benchmarks.bench_peers", *TINY_PEERS, "--out", str(tmp_path), timeout_s=300)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "peers.json").read_text())
    assert set(result["latency"]["latency_ms"]) == {"direct", "docket", "litellm"}
    assert result["ratios"]["calls_per_s_docket_over_litellm"] is not None


def test_peers_without_litellm_says_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_litellm.LITELLM_ENV, "/nonexistent/litellm")
    executable, why = _litellm.find_litellm()
    assert executable is None
    assert "/nonexistent/litellm is not an executable file" in why


def test_peers_refuses_bad_sizes() -> None:
    done = run_script("benchmarks.bench_peers", "--no-litellm", "--calls", "0")
    assert done.returncode == 2
    assert done.stderr.strip() == "bench_peers: --calls must be >= 1"


def test_soak_reads_the_boundary_memory_over_runs(tmp_path: Path) -> None:
    done = run_script(
        "benchmarks.bench_soak", "--lengths", "40,120", "--warmup", "20", "--out", str(tmp_path),
        "--report", str(tmp_path / "report"),
    )  # fmt: skip
    # on 80 events a single 4 KiB page is 50 bytes an event: the verdict is not judged here
    assert done.returncode in (0, 1), done.stderr
    result = json.loads((tmp_path / "report" / "soak.json").read_text())
    assert [r["calls"] for r in result["runs"]] == [40, 120]
    for run in result["runs"]:
        assert run["events"] == 2 * run["calls"]  # counted after the warm-up, from the ledger
        assert run["ledger_lines"] >= 2 * (run["calls"] + 20)
        assert len(run["checkpoints"]) == bench_soak.CHECKPOINTS + 1
        assert all(p["rss_kib"] > 1000 for p in run["checkpoints"])  # a Python process's RSS
        assert run["peak_rss_kib"] >= run["rss_kib"]["end"]
        assert all(p["fds"] > 3 for p in run["checkpoints"])  # stdio, ledger, listener
    assert result["flat"] == (done.returncode == 0)
    assert "Verdict" in (tmp_path / "report" / "soak.md").read_text()


def test_soak_refuses_bad_lengths() -> None:
    done = run_script("benchmarks.bench_soak", "--lengths", "30000,5000")
    assert done.returncode == 2
    assert "increasing" in done.stderr and "\n" not in done.stderr.strip()
    done = run_script("benchmarks.bench_soak", "--lengths", "5k")
    assert done.returncode == 2 and "integers" in done.stderr


def test_soak_slope_and_memory_reader() -> None:
    assert bench_soak.slope([(0, 100), (10, 100), (20, 100)]) == 0
    assert bench_soak.slope([(0, 0), (10, 3500), (20, 7000)]) == pytest.approx(350)
    assert bench_soak.slope([(5, 1)]) is None
    mine = bench_soak.memory_kib(os.getpid())
    assert mine["VmHWM"] >= mine["VmRSS"] > 0


def test_rotations_put_each_path_in_each_place() -> None:
    names = ["direct", "docket", "litellm"]
    orders = [bench_peers.rotations(names, i) for i in range(6)]
    for place in range(3):
        assert sorted(o[place] for o in orders) == sorted(names * 2)


@pytest.mark.parametrize("module", ["benchmarks.bench_peers", "benchmarks.bench_soak"])
def test_an_unwritable_report_folder_is_one_line_before_any_run(
    module: str, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = run_script(module, "--report", str(blocker / "reports"), timeout_s=30)
    assert done.returncode == 2
    assert "cannot write reports to" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
