"""Game days with the team's own agent (`docket game-day --agent-command`): the two example
agents through retry-storm and circuit-breaker, an agent that gives up, one that never
starts, one on the anthropic SDK and one that streams on the openai SDK (each beside the
reference agents), the environment guard, the team policy merged under each phase, the
phase file's `your_agent:` and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import io_examples
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.gameday.agent_env import outside_urls
from chaos.gameday.phase import load_phases, loads_phase
from chaos.gameday.your_agent import UserAgent, for_user, merged_policy
from chaos.yamldoc import YamlError
from docket.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 150  # seconds for one `docket game-day` of two phases: a bound, not an expectation
REAL = "https://api.openai.com/v1"


def game_day(tmp_path: Path, *args: str, env: dict | None = None):
    report = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "docket", "game-day", "--report", str(report), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=ROOT,
        env=env,
    )
    data = json.loads((report / "gameday.json").read_text()) if report.exists() else {}
    return done, data, report


def findings(data: dict) -> dict[str, dict[str, dict]]:
    """phase -> check -> finding (phases with one run)."""
    return {
        p["name"]: {f["check"]: f for f in p["runs"][0]["your_agent"]["findings"]}
        for p in data["phases"]
    }


# One phase per test (each phase of both agents: the matrix, nox -s agent-matrix).


def test_the_openai_sdk_agent_shows_retry_amplification(tmp_path: Path):
    agent = f"{sys.executable} examples/openai_sdk_agent.py"
    done, data, report = game_day(tmp_path, "--phase", "circuit-breaker", "--agent-command", agent)
    assert done.returncode == 0, done.stdout + done.stderr  # warn: findings do not fail
    assert [p["verdict"] for p in data["phases"]] == ["pass"]  # the boundary held
    seen = findings(data)
    # the SDK's retries inside the app's own loop: one call tried far more than once
    amplified = seen["circuit-breaker"]["max_attempts"]
    assert amplified["verdict"] == "finding", amplified
    assert "one retry layer" in amplified["advice"].lower()
    for phase in seen.values():  # the SDK honours Retry-After
        assert phase["honours_retry_after"]["verdict"] != "finding", phase
    breaker = data["phases"][0]
    assert breaker["your_agent"]["beside"] == ["polite"]  # beside it, not in its place
    assert breaker["your_agent"]["skipped_checks"] == []  # the reference agent still ran
    assert breaker["runs"][0]["your_agent"]["exit"] == {"yours": 0}
    html = (report / "index.html").read_text()
    assert 'id="your-agent"' in html and "bounded attempts per logical call" in html
    # the retry budget is judged over every attempt it sent (one run measured 4 retries
    # of 11 calls: within 0.1 x 11 + 3, just), and said on the console
    mine = breaker["runs"][0]["your_agent"]
    budget = mine["retry_budget"]
    assert budget["first_attempts"] + budget["retries"] == mine["calls"], budget
    assert budget["within"] is (budget["retries"] <= budget["allowed"]), budget
    stayed = "within" if budget["within"] else "OVER"
    assert f"retry budget {stayed}: {budget['arithmetic']}" in done.stdout


def test_the_agent_that_ignores_retry_after_fails_that_check(tmp_path: Path):
    policy = tmp_path / "docket.toml"
    policy.write_text(
        textwrap.dedent(f"""
        [boundary]
        connect_timeout = 4.0
        [egress]
        allow = ["api.openai.com"]
        [providers.openai]
        kind = "openai"
        base_url = "{REAL}"
        key_env = "OPENAI_API_KEY"
        """)
    )
    env = dict(os.environ, LITELLM_API_BASE=REAL, OPENAI_API_KEY="sk-not-a-real-key")
    agent = f"{sys.executable} examples/ignores_retry_after_agent.py"
    done, data, report = game_day(
        tmp_path, "--phase", "retry-storm", "--policy", str(policy), "--agent-findings", "fail",
        "--", *agent.split(), env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # --agent-findings fail
    assert [p["verdict"] for p in data["phases"]] == ["pass"]  # the boundary held
    for phase in findings(data).values():
        assert phase["honours_retry_after"]["verdict"] == "finding", phase
        assert "Retry-After" in phase["honours_retry_after"]["evidence"][0]
    for phase in data["phases"]:
        run = phase["runs"][0]
        # the team's policy is the base, the phase's on top; no real provider in it
        assert run["policy"]["boundary"]["connect_timeout"] == 4.0
        assert run["policy"]["egress"]["allow"] == []
        assert REAL not in json.dumps(run["policy"])
        # the URL in the shell's environment never reached the agent
        tail = "\n".join(run["your_agent"]["stderr_tail"]["yours"])
        assert "LITELLM_API_BASE" in tail, tail
        # and nothing the run recorded went anywhere but the stubs
        ledger = Path(run["evidence_dir"]) / "ledger.jsonl"
        assert "api.openai.com" not in ledger.read_text()
    suites = {s.get("name"): s for s in ET.parse(report / "junit.xml").getroot()}
    yours = suites["your-agent"]
    assert int(yours.get("failures")) >= 1  # fail mode: each finding a <failure>
    assert int(suites["retry-storm"].get("failures")) == 0


# ---------------------------------------------------------------- the environment guard


def test_only_urls_to_the_boundary_pass():
    env = {
        "DOCKET_BOUNDARY_URL": "http://127.0.0.1:4000",
        "OPENAI_BASE_URL": "http://127.0.0.1:4000/openai/v1",
        "HTTPS_PROXY": "http://docket:tok@127.0.0.1:4000",
        "AZURE_OPENAI_ENDPOINT": "https://team.openai.azure.com/",
        "MIXED": "http://127.0.0.1:4000,https://api.anthropic.com",
        "OTHER_PORT": "http://127.0.0.1:4001/",
        "PATH": "/usr/bin:/bin",
    }
    assert outside_urls(env) == ["AZURE_OPENAI_ENDPOINT", "MIXED", "OTHER_PORT"]
    env.pop("DOCKET_BOUNDARY_URL")  # no boundary: every URL goes
    assert "OPENAI_BASE_URL" in outside_urls(env)


def test_the_guard_execs_the_command_without_outside_urls():
    env = dict(os.environ, DOCKET_BOUNDARY_URL="http://127.0.0.1:4000", ENDPOINT=REAL)
    code = "import os; print(os.environ.get('ENDPOINT'), os.environ['DOCKET_BOUNDARY_URL'], os.nice(0))"
    done = subprocess.run(
        [sys.executable, "-m", "chaos.gameday.agent_env", "--", sys.executable, "-c", code],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    # and second in line for the CPU, behind the reference agents that drive the phase
    nice = str(min(19, os.nice(0) + 5))
    assert done.returncode == 0 and done.stdout.split() == ["None", "http://127.0.0.1:4000", nice]
    assert "ENDPOINT" in done.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "chaos.gameday.agent_env", "--", "no-such-agent-cmd"],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    assert missing.returncode == 127 and "command not found" in missing.stderr


# ---------------------------------------------------------------- the policy and the phases


def test_the_phase_settings_win_and_the_team_upstreams_go():
    team = {
        "caps": {"max_usd": 5, "warn_at": 0.9},
        "providers": {"openai": {"base_url": REAL}},
        "egress": {"allow": ["api.openai.com"]},
        "secrets": {"drop_env": ["TEAM_TOKEN"]},
    }
    phase = {"caps": {"max_usd": 0.001}, "resilience": {"breaker_threshold": 3}}
    merged = merged_policy(team, phase)
    assert merged == {
        "caps": {"max_usd": 0.001, "warn_at": 0.9},
        "resilience": {"breaker_threshold": 3},
        "secrets": {"drop_env": ["TEAM_TOKEN"]},
    }
    assert team["egress"] == {"allow": ["api.openai.com"]}  # the input is not changed


def test_for_user_adds_the_agent_beside_the_reference_agents_on_two_routes_of_its_own():
    (storm,) = load_phases(["retry-storm"])
    user = UserAgent(command=("my-agent", "--fast"))
    mine = for_user(storm, user)
    scenario = mine.runs[0].scenario
    hammer, polite, yours = scenario.agents
    assert (hammer.name, polite.name) == ("hammer", "polite")  # the drivers stay
    assert polite.mode == "backoff" and hammer.mode == "hammer"
    assert yours.name == "yours" and yours.mode is None and yours.calls == polite.calls
    assert yours.command[-3:] == ("--", "my-agent", "--fast")
    assert "chaos.gameday.agent_env" in yours.command
    # both shapes, last, so child_env points both SDK variables at the user's routes
    assert [(p.name, p.kind) for p in scenario.providers][-2:] == [
        ("your-openai", "openai"), ("your-anthropic", "anthropic"),
    ]  # fmt: skip
    assert yours.provider == "your-openai"
    # the claims that need the boundary to the reference agents alone are not judged
    assert mine.user_view["skipped_checks"] == ["the backoff agent got all its calls through"]
    assert len(mine.expect) == len(storm.expect) - 1
    assert mine.runs[0].data["agents"][-1]["command"][-1] == "--fast"  # a subprocess gets it
    # room for the user's agent to run to max_wall_clock (20 s) and be stopped
    assert (storm.budget_s, mine.budget_s) == (20.0, 50.0)


def test_every_shipped_phase_takes_the_users_agent():
    phases = load_phases()
    assert len(phases) == 9
    for phase in phases:
        decl = phase.your_agent
        assert decl is not None and decl.takes_agent, phase.name
        mine = for_user(phase, UserAgent(command=("my-agent",)))
        for spec in mine.runs:
            kinds = {p.kind for p in spec.scenario.providers if p.name.startswith("your-")}
            assert kinds == {"openai", "anthropic"}, phase.name
            assert spec.scenario.agents[-1].name == "yours", phase.name


PHASE = """\
name: mine
title: a phase
fmea: [F03]
seed: 1
run:
  agents:
    - {name: a, mode: loop, calls: 2}
    - {name: b, mode: loop, calls: 2}
    - {name: c, command: [sleep, "1"]}
  max_wall_clock: 5s
expect:
  - name: something was recorded
    query: "length(events)"
    at_least: 1
"""


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ("your_agent: [a]", "must be a mapping"),
        ("your_agent: {workload: z}", "no reference agent named 'z'"),
        ("your_agent: {workload: c}", "no reference agent named 'c'"),  # a command agent
        ("your_agent: {checks: []}", "workload names the reference agent"),
        ("your_agent: {workload: a, checks: [polite]}", "not an agent check"),
        ("your_agent: {workload: a, checks: [max_attempts]}", "max_attempts: N"),
        ("your_agent: {workload: a, checks: [{honours_retry_after: 2}]}", "takes no value"),
        ("your_agent: {workload: a, oops: 1}", "unknown key 'oops'"),
        ("your_agent: {none: ''}", "say why"),
        ("your_agent: {none: why, workload: a}", "stands alone"),
    ],
)
def test_a_bad_your_agent_is_one_line_naming_the_place(block, problem):
    with pytest.raises(YamlError) as caught:
        loads_phase(PHASE + block + "\n", "mine.yaml")
    message = str(caught.value)
    assert problem in message and "your_agent" in message and "\n" not in message


def test_a_good_your_agent_and_about():
    text = PHASE.replace(
        "    at_least: 1\n",
        "    at_least: 1\n    about: agent\n",
    )
    phase = loads_phase(text + "your_agent: {workload: b, checks: [{max_attempts: 3}]}\n",
                        "mine.yaml")  # fmt: skip
    assert phase.your_agent.workload == "b"
    assert phase.expect[0].about == "agent"
    with pytest.raises(YamlError, match="about is one of"):
        loads_phase(
            PHASE.replace("    at_least: 1\n", "    at_least: 1\n    about: x\n"), "mine.yaml"
        )


def test_a_boundary_check_cannot_require_one_about_the_agent():
    text = PHASE.replace("    at_least: 1\n", "    at_least: 1\n    about: agent\n") + (
        '  - name: after\n    query: "length(events)"\n    at_least: 1\n'
        "    requires: something was recorded\n"
    )
    with pytest.raises(YamlError, match="cannot require a check about: agent"):
        loads_phase(text, "mine.yaml")


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--agent-command", ""], "--agent-command is empty"),
        (["--agent-command", "no-such-agent-cmd --x"], "no-such-agent-cmd: command not found"),
        (["--agent-command", "python3 'unclosed"], "cannot split"),
        (["--agent-findings", "loud"], "--agent-findings 'loud'"),
        (["--agent-command", "true", "--", "true"], "not both"),
        (["--policy", "/nonexistent/docket.toml"], "no such file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys, args, problem):
    from docket.cli import main

    assert main(["game-day", "--report", str(tmp_path / "r"), *args]) == 2
    err = capsys.readouterr().err
    assert problem in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r").exists()


def test_bad_input_through_the_real_command_line(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "docket", "game-day", "--agent-command", "no-such-agent-cmd"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "command not found" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "text", ["caps = 3\n", "\x00\x01binary", "[caps]\nmax_usd = -1\n", "[[[\n"]
)
def test_a_bad_policy_file_is_one_line(tmp_path: Path, capsys, text):
    from docket.cli import main

    policy = tmp_path / "docket.toml"
    policy.write_bytes(text.encode())
    assert main(["game-day", "--report", str(tmp_path / "r"), "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "docket.toml" in err, err


def test_user_agent_inputs_are_checked_without_a_process():
    from argparse import Namespace

    from chaos.gameday.your_agent import user_agent_from_args

    base = {"agent_command": None, "command": [], "policy": None, "agent_findings": None}
    assert user_agent_from_args(Namespace(**base)) is None  # a game day as it always was
    with pytest.raises(InputError, match="NUL"):
        user_agent_from_args(Namespace(**{**base, "command": ["--", "a\x00b"]}))
    user = user_agent_from_args(Namespace(**{**base, "command": ["--", sys.executable, "x.py"]}))
    assert user is not None and user.command == (sys.executable, "x.py") and user.findings == "warn"


def test_an_agent_that_cannot_start_is_a_finding_naming_its_error_not_an_unknown(tmp_path):
    # An agent whose SDK is not installed: the reference agents still drive the phase,
    # so Docket's checks are judged, and the agent's own error is the finding. Any phase
    # shows it: the quickest (upstream-failure, ~0.6 s; upstream-latency took ~7 s).
    agent = f'{sys.executable} -c "import anthropic_sdk_not_installed"'
    done, data, _ = game_day(tmp_path, "--phase", "upstream-failure", "--agent-command", agent)
    assert done.returncode == 0, done.stdout + done.stderr  # warn: the boundary held
    (phase,) = data["phases"]
    assert phase["verdict"] == "pass" and {c["verdict"] for c in phase["checks"]} == {"pass"}
    run = phase["runs"][0]
    assert run["error"] is None and run["your_agent"]["exit"] == {"yours": 1}
    found = findings(data)["upstream-failure"]["runs_to_the_end"]
    assert found["verdict"] == "finding", found
    assert found["summary"].startswith("your agent made no call and exited 1: ModuleNotFoundError")
    assert "anthropic_sdk_not_installed" in found["summary"]
    met = run["your_agent"]["met"]["breaker openings"]
    assert met.startswith("not exercised: your agent exited 1 without a call"), met


GIVES_UP = """\
import os, sys, httpx
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
with httpx.Client(base_url=base, headers={"authorization": f"Bearer {key}"}, timeout=5) as http:
    for i in range(int(os.environ.get("DOCKET_AGENT_CALLS", "10"))):
        body = {"model": "gpt-4o-mini", "max_tokens": 4,
                "messages": [{"role": "user", "content": f"line {i}"}]}
        answer = http.post("/chat/completions", json=body)
        if answer.status_code != 200:
            print(f"line {i}: HTTP {answer.status_code}; giving up", file=sys.stderr)
            sys.exit(1)
"""


def test_an_agent_that_gives_up_at_its_first_error_leaves_the_breaker_judged(tmp_path: Path):
    # The breaker phase used to FAIL ("the whole cycle is in the ledger"...) when the
    # user's agent, in the reference agent's place, stopped at its first 503: a mechanism
    # it never drove read as a broken breaker. Now the reference agent drives the breaker
    # beside it, and giving up is a finding about the agent, with where and why.
    script = tmp_path / "gives_up.py"
    script.write_text(GIVES_UP)
    agent = f"{sys.executable} {script}"
    done, data, _ = game_day(tmp_path, "--phase", "circuit-breaker", "--agent-command", agent)
    assert done.returncode == 0, done.stdout + done.stderr
    (phase,) = data["phases"]
    assert phase["verdict"] == "pass", [c for c in phase["checks"] if c["verdict"] != "pass"]
    run = phase["runs"][0]["your_agent"]
    assert run["exit"] == {"yours": 1} and run["calls"] == 3  # 503 at its stub's call 3
    found = findings(data)["circuit-breaker"]["runs_to_the_end"]
    assert found["verdict"] == "finding", found
    assert found["summary"].startswith("your agent exited 1 after 3 calls, its last at seq ")
    assert "(failed, upstream_status 503): line 2: HTTP 503; giving up" in found["summary"]
    assert run["met"]["breaker openings"].startswith("not exercised: your agent exited 1")
    assert run["retry_budget"]["within"] is True  # it never retried at all
    assert run["retry_budget"]["arithmetic"] == "0 retries <= 0.1 x 3 first attempts + 3 = 3.3"
    assert "retry budget within: 0 retries <= 0.1 x 3" in done.stdout
    html = (tmp_path / "report" / "index.html").read_text()
    assert "retry budget within: 0 retries &lt;= 0.1 x 3 first attempts + 3 = 3.3" in html


ANTHROPIC = """\
import os, anthropic
client = anthropic.Anthropic(timeout=5)
for i in range(int(os.environ.get("DOCKET_AGENT_CALLS", "10"))):
    try:
        client.messages.create(model="claude-3-5-haiku-latest", max_tokens=8,
                               messages=[{"role": "user", "content": f"email {i}"}])
    except anthropic.APIError as exc:
        print(f"email {i}: {type(exc).__name__}", flush=True)
"""


def test_an_anthropic_sdk_agent_is_driven_and_judged_like_an_openai_one(tmp_path: Path):
    script = tmp_path / "claude.py"
    script.write_text(ANTHROPIC)
    agent = f"{sys.executable} {script}"
    done, data, _ = game_day(tmp_path, "--phase", "circuit-breaker", "--agent-command", agent)
    assert done.returncode == 0, done.stdout + done.stderr
    (phase,) = data["phases"]
    assert phase["verdict"] == "pass", [c for c in phase["checks"] if c["verdict"] != "pass"]
    run = phase["runs"][0]["your_agent"]
    # On its own Anthropic-shaped route (how many calls it gets to before the run's
    # wall clock ends depends on how fast a busy machine imports the SDK: a hint).
    assert run["calls_by_route"]["your-anthropic"] >= 1, run
    assert run["calls_by_route"]["your-openai"] == 0, run
    seen = findings(data)["circuit-breaker"]
    assert seen["max_attempts"]["verdict"] in ("ok", "finding"), seen["max_attempts"]
    # it exited 0, or the run's wall clock stopped it: neither is giving up
    assert seen["runs_to_the_end"]["verdict"] == "ok", seen["runs_to_the_end"]
    if run["calls"] >= 3:  # its stub's 503s start at its third call
        assert isinstance(run["met"]["upstream failures"], int), run["met"]


STREAMS = """\
import os, openai
client = openai.OpenAI(timeout=5, max_retries=0)
for i in range(int(os.environ.get("DOCKET_AGENT_CALLS", "10"))):
    try:
        for chunk in client.chat.completions.create(
            model="gpt-4o-mini", max_tokens=8, stream=True,
            messages=[{"role": "user", "content": f"message {i}"}],
        ):
            pass
    except (openai.APIError, openai.APIConnectionError) as exc:
        print(f"message {i}: {type(exc).__name__}", flush=True)
"""


def test_a_streaming_openai_agent_keeps_body_for_body(tmp_path: Path):
    # stream=True without stream_options: the boundary forwards the body with
    # stream_options.include_usage added. The check compared the stub's bytes with the
    # digest of the agent's bytes and failed; it now reads forwarded_sha256.
    script = tmp_path / "streams.py"
    script.write_text(STREAMS)
    agent = f"{sys.executable} {script}"
    done, data, _ = game_day(tmp_path, "--phase", "upstream-failure", "--agent-command", agent)
    (phase,) = data["phases"]
    run = phase["runs"][0]
    ledger = Path(run["evidence_dir"]) / "ledger.jsonl"
    events = [json.loads(line) for line in ledger.read_text().splitlines()]
    streamed = [
        e for e in events if e["type"] == "model.request" and e["provider"] == "your-openai"
    ]
    assert streamed and all(e["stream"] for e in streamed)
    assert all(e["forwarded_changes"] == ["stream_options.include_usage"] for e in streamed)
    bad = [c for c in phase["checks"] if c["verdict"] != "pass"]
    assert phase["verdict"] == "pass" and done.returncode == 0, bad


IGNORES_SIGTERM = """\
import os, signal, sys, time, httpx
signal.signal(signal.SIGTERM, signal.SIG_IGN)
failed = 0
base = os.environ["OPENAI_BASE_URL"]
key = os.environ["OPENAI_API_KEY"]
body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
with httpx.Client(base_url=base, headers={"authorization": f"Bearer {key}"}, timeout=2) as http:
    for i in range(1000):
        body["messages"][0]["content"] = f"question {i}"
        try:
            http.post("/chat/completions", json=body)
        except httpx.HTTPError as exc:  # the boundary going away under it: said, then on
            failed += 1
            print(f"call {i} failed ({type(exc).__name__}); {failed} so far", file=sys.stderr)
        time.sleep(0.02)  # its own pace between calls (an agent's, not the test's wait)
"""


def test_an_agent_that_ignores_sigterm_is_a_finding(tmp_path: Path):
    script = tmp_path / "stubborn.py"
    script.write_text(IGNORES_SIGTERM)
    # Ignored from its first instant (a disposition of SIG_IGN survives exec): with the
    # reference agents beside it the ledger can fill while Python is still importing, and
    # a SIGTERM then ended it before its own signal.signal line ran (exit 143, no finding).
    launcher = tmp_path / "stubborn.sh"
    launcher.write_text(f"#!/bin/sh\ntrap '' TERM\nexec {sys.executable} {script}\n")
    launcher.chmod(0o755)
    agent = str(launcher)
    # One run (the event ceiling) shows it: each run holds the stubborn agent's grace period.
    done, data, _ = game_day(
        tmp_path, "--phase", "ledger-pressure:events", "--agent-command", agent
    )
    assert done.returncode == 0, done.stdout + done.stderr  # the boundary held; warn
    (phase,) = data["phases"]
    assert phase["verdict"] == "pass"
    found = findings(data)["ledger-pressure"]["exits_on_sigterm"]
    assert found["verdict"] == "finding", found
    assert "killed" in found["summary"] and "SIGTERM" in found["advice"]


def _day(mode: str | None):
    from chaos.gameday.assertions import Check
    from chaos.gameday.results import CheckResult, GameDayResult, PhaseResult, PhaseRun

    finding = {"check": "max_attempts", "title": "bounded attempts per logical call",
               "verdict": "finding", "summary": "1 of 10 calls took more than 4 attempts",
               "evidence": ["seq 6..23: 6 attempts"], "seqs": [[6, 23]], "advice": "one layer"}  # fmt: skip
    ok = {**finding, "check": "honours_retry_after", "title": "honours Retry-After",
          "verdict": "ok", "summary": "all waited", "advice": ""}  # fmt: skip
    check = CheckResult(Check("c", "q", "equals", 1, 1, "pass", ""), 3)
    run = PhaseRun(
        name="run",
        your_agent={"agents": ["polite"], "exit": {"polite": 0}, "calls": 12,
                    "stderr_tail": {"polite": ["done <b>"]}, "findings": [finding, ok]},
    )  # fmt: skip
    yours = PhaseResult("circuit-breaker", "t", "", ("F03",), 1, "in-process", "gamedays/x.yaml",
                        "r", 1.0, 20.0, (check,), (run,),
                        {"beside": ["polite"], "skipped_checks": ["about the agent"],
                         "why_not": "", "checks": [], "policy": "", "command": "my agent"})  # fmt: skip
    theirs = PhaseResult("partition", "t", "", ("F04",), 1, "in-process", "gamedays/y.yaml",
                         "r", 1.0, 20.0, (check,), (PhaseRun(name="run"),),
                         {"beside": [], "why_not": "a shared route", "skipped_checks": []})  # fmt: skip
    return GameDayResult((yours, theirs), "2026-01-01T00:00:00Z", 2.0, None, "0", False, mode)


def test_findings_in_json_junit_and_html():
    from chaos.gameday.report import render_html, render_junit
    from chaos.gameday.results import GameDayResult

    warn, fail = _day("warn"), _day("fail")
    assert (warn.exit_code, fail.exit_code, warn.findings()) == (0, 1, 1)
    again = GameDayResult.from_json(json.loads(json.dumps(warn.to_json())))
    assert again.to_json() == warn.to_json() and again.agent_findings == "warn"
    suites = {s.get("name"): s for s in ET.fromstring(render_junit(warn))}
    yours = suites["your-agent"]
    assert (yours.get("tests"), yours.get("failures"), yours.get("skipped")) == ("3", "0", "2")
    skipped = [c.find("skipped").get("message") for c in yours if c.find("skipped") is not None]
    assert skipped[0].startswith("finding (warn): 1 of 10 calls")
    assert "a shared route" in skipped[1]
    failed = {s.get("name"): s for s in ET.fromstring(render_junit(fail))}["your-agent"]
    assert failed.get("failures") == "1" and failed.find("testcase/failure") is not None
    # whose failure it is: the agent's, said at the head of the message and of the report
    message = failed.find("testcase/failure").get("message")
    assert message.startswith("your agent's finding, not Docket's: 1 of 10 calls"), message
    assert fail.whose_failures() == {"docket": [], "agent": ["circuit-breaker: max_attempts"]}
    assert (
        fail.whose()
        == "your agent's: 1 finding (--agent-findings fail); Docket's boundary checks held"
    )
    assert warn.whose() == "" and "Whose failure" in render_html(fail, rows=[])
    html = render_html(warn, rows=[])
    assert 'href="#your-agent"' in html and "one layer" in html and "a shared route" in html
    assert "done &lt;b&gt;" in html  # the agent's stderr is escaped
    plain = GameDayResult(warn.phases[:0], "2026-01-01T00:00:00Z", 2.0, None, "0")
    assert "your-agent" not in render_html(plain, rows=[]) + render_junit(plain)


_tables = st.dictionaries(
    st.sampled_from(["caps", "resilience", "egress", "providers", "boundary", "secrets"]),
    st.dictionaries(st.sampled_from(["allow", "a", "b", "max_usd"]), st.integers(0, 9), max_size=3),
    max_size=5,
)


@settings(max_examples=io_examples(), deadline=None)
@given(_tables, _tables)
def test_merged_policy_phase_wins_and_no_upstream_comes_from_the_team(team, phase):
    merged = merged_policy(team, phase)
    assert "providers" not in merged or merged["providers"] == phase.get("providers")
    for table, values in phase.items():
        for key, value in values.items():
            assert merged[table][key] == value  # the phase's settings are laid on top
    team_allow = team.get("egress", {}).get("allow")
    if team_allow is not None and "allow" not in phase.get("egress", {}):
        assert "allow" not in merged.get("egress", {})


def test_a_subprocess_phase_hands_the_merged_policy_on():
    (killed,) = load_phases(["supervisor-killed"])
    mine = for_user(killed, UserAgent(policy={"boundary": {"connect_timeout": 3.0}}))
    for spec in mine.runs:
        assert spec.data["policy"]["boundary"]["connect_timeout"] == 3.0  # run.yaml gets it
        assert spec.scenario.agents == killed.runs[0].scenario.agents  # no agent: its own
    assert mine.user_view["beside"] == [] and mine.expect == killed.expect


def test_a_broken_boundary_check_is_dockets_failure_in_junit():
    from chaos.gameday.assertions import Check
    from chaos.gameday.report import render_junit
    from chaos.gameday.results import CheckResult, GameDayResult, PhaseResult, PhaseRun

    broke = CheckResult(Check("nothing reached the stub", "q", "equals", 0, 2, "fail", "got 2"), 3)
    phase = PhaseResult("circuit-breaker", "t", "", ("F03",), 1, "in-process", "gamedays/x.yaml",
                        "r", 1.0, 20.0, (broke,), (PhaseRun(name="run"),), {})  # fmt: skip
    day = GameDayResult((phase,), "2026-01-01T00:00:00Z", 1.0, None, "0", False, "warn")
    assert day.whose_failures()["docket"] == ["circuit-breaker: nothing reached the stub"]
    assert day.whose().startswith("Docket's: 1 boundary check broke")
    suite = {s.get("name"): s for s in ET.fromstring(render_junit(day))}["circuit-breaker"]
    message = suite.find("testcase/failure").get("message")
    assert message == "Docket's failure (a boundary invariant broke): got 2"


def test_the_summary_line_says_whose_failure_it_is():
    import io

    from rich.console import Console

    from chaos.gameday.progress import Progress
    from chaos.gameday.report import Written

    out = io.StringIO()
    progress = Progress(2, console=Console(file=out, highlight=False))
    progress.summary(_day("fail"), Written(None, None, None))
    assert (
        "  whose failure: your agent's: 1 finding (--agent-findings fail); Docket's boundary checks held\n"
        in out.getvalue()
    )
    quiet = io.StringIO()
    Progress(2, console=Console(file=quiet)).summary(_day("warn"), Written(None, None, None))
    assert "whose failure" not in quiet.getvalue()
