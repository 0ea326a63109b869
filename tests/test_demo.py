"""The main job (until the game day exists): `docket demo` end to end, as the README runs it."""

import json
import subprocess
import sys
import tempfile

from docket.demo import demo_command


def test_demo_runs_a_capped_agent_and_checks_its_evidence(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "docket", "demo", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    receipt = json.loads((tmp_path / "run" / "receipt.json").read_text())
    assert receipt["exit"]["status"] == 42 and receipt["exit"]["cap"] == "max_model_calls"
    assert receipt["totals"]["model_calls"] == 6
    assert "chain_break" in done.stdout and "torn_tail" in done.stdout


def test_without_dir_its_folder_is_removed_and_named(tmp_path, monkeypatch, capsys):
    """Failed before: every `docket demo` left a /tmp/docket-demo-* folder behind."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert demo_command(None) == 0
    out = capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    last = out.strip().splitlines()[-1]
    assert last.startswith(f"removed {tmp_path}/docket-demo-") and "--dir" in last
