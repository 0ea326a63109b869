"""Every verb's --help: exit 0, a description, examples that name the verb; -V; and the
lists the help repeats (agent modes, game-day phases, the agent's environment) held
to the code and the files they describe, so they cannot drift apart."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from docket.agent.config import MODES
from docket.cli import build_parser, main
from docket.cli_help import AGENT_ENV, AGENT_MODES, GAMEDAY_PHASES
from docket.policy import policy_from_dict
from docket.run.child import child_env

ROOT = Path(__file__).resolve().parent.parent


def verb_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


VERBS = sorted(verb_parsers())


def help_text(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_there_are_verbs_to_check():
    assert {"verify", "run", "selftest", "game-day", "chaos", "stub"} <= set(VERBS)


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_has_a_description_and_examples_of_itself(verb, capsys):
    text = help_text(capsys, verb)
    parser = verb_parsers()[verb]
    assert parser.description and len(parser.description) > 40, f"{verb}: no description"
    assert "examples:" in text, f"{verb}: no examples"
    examples = text.split("examples:", 1)[1]
    assert re.search(rf"^\s+docket( run --)? {re.escape(verb)}\b", examples, re.M) or (
        f"docket {verb}" in examples
    ), f"{verb}: the examples do not run it"


def test_version_short_and_long(capsys):
    from docket import __version__

    for flag in ("-V", "--version"):
        with pytest.raises(SystemExit) as done:
            main([flag])
        assert done.value.code == 0
        assert capsys.readouterr().out.strip() == f"docket {__version__}"


def test_version_through_the_command_line():
    done = subprocess.run(
        [sys.executable, "-m", "docket", "-V"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.startswith("docket ")


def test_the_agent_modes_are_the_agents(capsys):
    assert AGENT_MODES == MODES
    for verb in ("chaos", "agent"):
        text = " ".join(help_text(capsys, verb).split())
        assert all(mode in text for mode in MODES), verb


def test_the_phases_are_the_game_days_files(capsys):
    names = []
    for path in sorted((ROOT / "gamedays").glob("*.yaml")):
        match = re.search(r"^name:\s*(\S+)", path.read_text(encoding="utf-8"), re.M)
        assert match, path
        names.append(match.group(1))
    assert tuple(names) == GAMEDAY_PHASES
    text = " ".join(help_text(capsys, "game-day").split())
    assert all(name in text for name in GAMEDAY_PHASES)


def test_stub_kind_has_help(capsys):
    text = " ".join(help_text(capsys, "stub").split())
    assert "--kind {openai,anthropic} the API shape" in text


def _variables_child_env_sets() -> set[str]:
    policy = policy_from_dict(
        {
            "providers": {
                "openai": {"kind": "openai", "base_url": "http://127.0.0.1:1"},
                "anthropic": {"kind": "anthropic", "base_url": "http://127.0.0.1:2"},
            }
        },
        source="<test>",
    )
    env = child_env({}, "http://127.0.0.1:4000", "dkt-token", policy)
    return set(env)


def test_the_environment_table_names_every_variable_the_agent_gets(capsys):
    names = _variables_child_env_sets()
    assert {"OPENAI_BASE_URL", "DOCKET_RUN_TOKEN", "HTTPS_PROXY", "no_proxy"} <= names
    run_help = help_text(capsys, "run")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in names:
        assert re.search(rf"\b{name}\b", AGENT_ENV), f"{name} missing from cli_help.AGENT_ENV"
        assert re.search(rf"\b{name}\b", run_help), f"{name} missing from docket run --help"
        assert re.search(rf"`{name}`", readme), f"{name} missing from README's table"
