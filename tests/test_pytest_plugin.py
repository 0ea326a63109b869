"""docket's pytest plugin (docket/pytest_plugin.py), with pytester: the example agent's
test suite (examples/pytest_replay) recorded against a stub provider (`--docket-record`,
through `docket run`), then run offline from the recordings with the stub stopped, then
run with the agent's prompt changed, which fails with the divergence in the report.

Real processes (the stub, pytest in a subprocess, docket run / docket replay under it),
since the process is the point: those are marked slow."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from test_replay import ENV, start_stub

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pytest_replay"
DEADLINE = 120


def plugin_args() -> list[str]:
    """-p docket.pytest_plugin, unless the installed distribution already loads it by its
    entry point (registering it twice is an error)."""
    loaded = any(ep.name == "docket" for ep in entry_points(group="pytest11"))
    return [] if loaded else ["-p", "docket.pytest_plugin"]


@pytest.fixture
def suite(pytester, monkeypatch):
    for name in ("agent.py", "test_agent.py"):
        shutil.copy(EXAMPLE / name, pytester.path / name)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{pytester.path}")
    return pytester


def run(pytester, *args):
    return pytester.runpytest_subprocess(
        *plugin_args(), "-p", "no:cacheprovider", *args, timeout=DEADLINE
    )


def test_the_plugin_imports_nothing_heavy():
    """pytest loads it at every start-up (its entry point): the standard library and
    pytest only; docket itself runs in the subprocess."""
    code = (
        "import sys, docket.pytest_plugin; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('trio', 'httpx', 'h11', 'openai', 'chaos') or m.startswith('docket.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['docket.pytest_plugin']"


@pytest.mark.slow
def test_record_then_replay_offline_then_a_changed_prompt_fails(suite):
    stub, url = start_stub("openai")
    try:
        (suite.path / "docket.toml").write_text(
            "[ledger]\nrecord_bodies = true\n"
            f'[providers.openai]\nkind = "openai"\nbase_url = "{url}"\n'
            'key_env = "OPENAI_KEY_FOR_TEST"\n'
        )
        recorded = run(suite, "--docket-record")
        recorded.assert_outcomes(passed=2)
    finally:
        stub.terminate()
        stub.wait(timeout=DEADLINE)
    host, port = url.removeprefix("http://").split(":")
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=2):
        pass  # offline from here: nothing listens where the stub was
    for name, calls in (("greet", 1), ("greet_all", 2)):
        receipt = json.loads((suite.path / "runs" / name / "receipt.json").read_text())
        assert receipt["totals"]["model_calls"] == calls and receipt["totals"]["cost_nusd"] > 0

    replayed = run(suite, "--basetemp", str(suite.path / "replay-tmp"))
    replayed.assert_outcomes(passed=2)
    assert not list((suite.path / "replay-tmp").glob("*/docket"))  # removed on a pass

    agent = suite.path / "agent.py"
    agent.write_text(agent.read_text().replace("in five words", "in three words"))
    changed = run(suite, "--basetemp", str(suite.path / "changed-tmp"))
    changed.assert_outcomes(failed=2)
    text = changed.stdout.str()
    # the SDK's own error, raised in the test, saying why
    assert "openai.BadRequestError: Error code: 400 - docket replay: no recorded answer" in text
    assert "the first request with no recorded answer, against the nearest:" in text
    assert '"path": "messages[0].content"' in text
    assert '"recorded": "Greet Ada in five words."' in text
    assert '"asked": "Greet Ada in three words."' in text
    # (pytest links each test's newest folder as NAMEcurrent: the same folder twice)
    kept = sorted(
        {p.resolve() for p in (suite.path / "changed-tmp").glob("*/docket/run/ledger.jsonl")}
    )
    assert len(kept) == 2  # each failed test's replay ledger, kept where the report says
    assert (
        f"is kept in {kept[0].parent.parent}" in text
        or f"is kept in {kept[1].parent.parent}" in text
    )

    # An agent that swallows the error passes its test, but the replay diverged: failed at
    # teardown with the diff.
    (suite.path / "test_swallows.py").write_text(
        "import agent, openai, pytest\n\n"
        '@pytest.mark.docket_replay("runs/greet", policy="docket.toml")\n'
        "def test_swallows():\n"
        "    try:\n        agent.greet('Ada')\n"
        "    except openai.BadRequestError:\n        pass\n"
    )
    swallowed = run(suite, "test_swallows.py")
    swallowed.assert_outcomes(passed=1, errors=1)
    assert '"asked": "Greet Ada in three words."' in swallowed.stdout.str()


@pytest.mark.slow
def test_recording_without_bodies_is_refused_before_anything_runs(suite):
    (suite.path / "docket.toml").write_text('[providers.openai]\nkind = "openai"\n')
    refused = run(suite, "--docket-record")
    refused.assert_outcomes(errors=2)
    assert "must set record_bodies = true under [ledger]" in refused.stdout.str()
    assert not (suite.path / "runs").exists()
