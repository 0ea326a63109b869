"""A provider key that cannot be used is refused
before anything runs (exit 2, one line, the value never shown); an unset one is one
warning line and is on record; the agent's environment carries no provider key,
configured or not. And `docket run -- ""` is one line and exit 2 (part 5)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import read_events
from hypothesis import given
from hypothesis import strategies as st

from docket.guards.keys import WELL_KNOWN_KEY_ENV, agent_drops, key_problem
from docket.policy import Policy, policy_from_dict
from docket.run.child import child_env

KEY = "sk-proj-a-perfectly-good-key-123456"


def docket_run(tmp_path, *command, env_extra=None, policy=None):
    env = {k: v for k, v in os.environ.items() if k not in WELL_KNOWN_KEY_ENV}
    env.update(env_extra or {})
    argv = [sys.executable, "-m", "docket", "run", "--ledger-dir", str(tmp_path / "run")]
    if policy is not None:
        argv += ["--policy", str(policy)]
    return subprocess.run(
        [*argv, "--", *command], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "bad", [KEY + "\n", KEY + "\r\n", "sk-a\rb-0123456789", "sk-\x1b[0m-key-0123"]
)
def test_a_key_with_a_line_break_or_control_byte_is_refused_at_start(tmp_path, bad):
    r = docket_run(tmp_path, "true", env_extra={"OPENAI_API_KEY": bad})
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "OPENAI_API_KEY" in r.stderr and KEY not in r.stderr and "sk-a" not in r.stderr
    assert not (tmp_path / "run" / "ledger.jsonl").exists()  # nothing half-written


@given(st.text(max_size=40))
def test_key_problem_refuses_every_control_byte(value):
    problem = key_problem(value)
    clean = all(0x20 <= ord(ch) < 0x7F for ch in value)
    assert (problem is None) == clean


def test_an_unset_key_is_one_warning_line_and_on_record(tmp_path):
    r = docket_run(tmp_path, "true", env_extra={"OPENAI_API_KEY": KEY})
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    warnings = [line for line in lines if "warning" in line]
    assert warnings == [
        "docket: warning: no provider key in ANTHROPIC_API_KEY (provider anthropic): "
        "its calls go upstream without a key"
    ]
    assert lines[0] == warnings[0]  # at start, before the run's last line
    start = read_events(tmp_path / "run" / "ledger.jsonl")[0]
    assert start["keys_missing"] == [{"provider": "anthropic", "key_env": "ANTHROPIC_API_KEY"}]


def test_every_key_set_means_no_warning(tmp_path):
    keys = {"OPENAI_API_KEY": KEY, "ANTHROPIC_API_KEY": KEY + "-ant"}
    r = docket_run(tmp_path, "true", env_extra=keys)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert "keys_missing" not in read_events(tmp_path / "run" / "ledger.jsonl")[0]


def test_the_agent_gets_no_well_known_or_policy_named_key(tmp_path):
    policy = tmp_path / "docket.toml"
    policy.write_text('[secrets]\ndrop_env = ["MY_GATEWAY_KEY"]\n')
    base = {name: f"secret-of-{name}" for name in WELL_KNOWN_KEY_ENV}
    base |= {"MY_GATEWAY_KEY": "gw-secret", "PATH": "/usr/bin", "HOME": "/home/x"}
    loaded = policy_from_dict({"secrets": {"drop_env": ["MY_GATEWAY_KEY"]}})
    env = child_env(base, "http://127.0.0.1:1", "dkt-token", loaded)
    assert env["PATH"] == "/usr/bin" and env["HOME"] == "/home/x"
    for value in env.values():
        assert "secret" not in value
    # The SDKs' own names carry the run's token, not a key; the rest are gone.
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] == "dkt-token"
    assert "GEMINI_API_KEY" not in env and "MY_GATEWAY_KEY" not in env
    assert agent_drops(Policy()) >= {"GROQ_API_KEY", "MISTRAL_API_KEY", "COHERE_API_KEY"}


def test_a_bad_drop_env_name_is_a_policy_error(tmp_path):
    policy = tmp_path / "docket.toml"
    policy.write_text('[secrets]\ndrop_env = ["NOT A NAME"]\n')
    r = docket_run(tmp_path, "true", policy=policy)
    assert r.returncode == 2 and "secrets.drop_env[0]" in r.stderr, r.stderr


@pytest.mark.parametrize("command", [[""], ["", "x"], ["true", "a\x00b"]])
def test_an_empty_or_nul_command_is_one_line_and_exit_2(tmp_path, command):
    if any("\x00" in arg for arg in command):
        # subprocess cannot pass a NUL either: go through the CLI's own entry point
        from docket.cli import main

        assert main(["run", "--ledger-dir", str(tmp_path / "run"), "--", *command]) == 2
        return
    r = docket_run(tmp_path, *command)
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "empty" in r.stderr
