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


# "exit 1", "Exit: ..., 42 when ...", "Exit 0 when equal, 1 when they differ, 2 on ...":
# the clause from the word to the end of its sentence or line, and the codes in it (a
# number followed by a unit, as in "10 s", is a figure, not a code).
EXIT_CLAUSE = re.compile(r"\bexit\b[^.\n]*", re.I)
CODE = re.compile(r"(?<![\w.-])(\d{1,3})\b(?!\s*(?:s|ms|MiB|GiB|bytes|%)\b)")


def documented_exits(parser: argparse.ArgumentParser) -> set[int]:
    """The exit codes a verb's own help names: its description, epilog and flags' help."""
    texts = [parser.description or "", parser.epilog or ""]
    texts += [a.help for a in parser._actions if isinstance(a.help, str)]
    return {
        int(code)
        for text in texts
        for clause in EXIT_CLAUSE.findall(text)
        for code in CODE.findall(clause)
    }


def top_level_exits() -> dict[int, str]:
    """`docket --help`'s exit-code list: code -> what it says (its lines joined)."""
    entries: dict[int, str] = {}
    code = None
    for line in build_parser().epilog.splitlines()[1:]:
        head = re.match(r"  (\d+)\s+(.*)", line)
        if head:
            code = int(head.group(1))
            entries[code] = head.group(2)
        elif code is not None:
            entries[code] += " " + line.strip()
    return entries


def test_every_exit_code_a_verb_documents_is_in_the_top_level_list():
    listed = top_level_exits()
    assert {0, 1, 2, 42, 43, 70} <= set(listed)
    seen = {}
    for verb, parser in verb_parsers().items():
        codes = documented_exits(parser)
        seen[verb] = codes
        assert codes <= set(listed), f"{verb} --help names exit {codes - set(listed)}"
        if 1 in codes:  # 1 means something of each verb's own: the list says what
            assert re.search(rf"\b{re.escape(verb)}\b", listed[1]), f"exit 1 does not name {verb}"
    # the verbs whose exit 1 is their own, as their help says it
    assert {v for v, codes in seen.items() if 1 in codes} >= {
        "diff",
        "export",
        "fleet",
        "prune",
        "replay",
        "selftest",
    }, seen
    assert seen["run"] >= {42, 43}
