"""Hostile input, verb by verb: one line on stderr naming the problem, exit 2, no
traceback, and nothing half-written (the run, chaos and report folders a refused
command was given are not created).

Each row is a process with a timeout and a memory bound, run in its own folder:
`docket`'s main forked from the test (tests/helpers.py docket_forked), and for the rows
in INTERPRETER a real `python -m docket`, so the interpreter's own start (the module
entry, imports, its exit code) stays covered too. `before` says how main (45701c5) answered each row: EXIT_70 (an internal
error, a hang, or memory without bound), WRONG (accepted, or refused without
naming the problem), or nothing (already right: kept so it stays right). Every
EXIT_70 and WRONG row fails on that commit (checked by running this file there).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import docket_forked

EXIT_70 = "exit 70"
WRONG = "wrong answer"
TIMEOUT = 60  # seconds: a bound for a 2-core machine shared with other runs
GAMEDAYS = Path(__file__).resolve().parent.parent / "gamedays"
PHASE = (GAMEDAYS / "01-upstream-failure.yaml").read_text(encoding="utf-8")


def _policy(text: str) -> dict:
    return {"p.toml": text}


def _base_url(url: str) -> dict:
    return _policy(f'[providers.openai]\nbase_url = "{url}"\n')


def _alias_bomb(top_key: str) -> str:
    """Nine anchors of nine aliases each: 9^9 values once expanded (~900 bytes)."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    lines.append(f"{top_key}: *i")
    return "\n".join(lines) + "\n"


def _phase(replace: str, by: str) -> dict:
    assert replace in PHASE
    return {"01-upstream-failure.yaml": PHASE.replace(replace, by, 1)}


DEEP_QUERY = "(" * 2000 + "injected" + ")" * 2000


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # "{dir}" is the case's folder
    fragment: str  # what the one line must say
    files: dict = field(default_factory=dict)  # name -> text (str) or bytes
    before: str = ""  # how main (45701c5) answered: EXIT_70, WRONG, or "" (already right)
    untouched: tuple[str, ...] = ("out",)  # folders the refused command must not create
    env: tuple[tuple[str, str], ...] = ()


def run_case(case: Case, folder: Path, *, interpreter: bool = False) -> None:
    for name, data in case.files.items():
        target = folder / name
        if isinstance(data, bytes):
            target.write_bytes(data)
        else:
            target.write_text(data, encoding="utf-8")
    argv = [a.replace("{dir}", str(folder)) for a in case.argv]
    env = {**os.environ, **dict(case.env)}
    if interpreter:
        result = subprocess.run(
            [sys.executable, "-m", "docket", *argv],
            cwd=folder,
            env=env,
            capture_output=True,
            timeout=TIMEOUT,
            preexec_fn=_bounded_memory,  # noqa: PLW1509 - a fresh child, one thread
            check=False,
        )
    else:
        result = docket_forked(argv, cwd=folder, env=env, timeout=TIMEOUT, memory=MEMORY)
    err = result.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err[-2000:]
    assert result.returncode == 2, (result.returncode, err[-2000:])
    assert err.startswith("docket: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert "internal error" not in err, err
    assert case.fragment in err, f"expected {case.fragment!r} in {err!r}"
    for name in case.untouched:
        assert not (folder / name).exists(), f"{name} was created by a refused command"


# The alias bomb grew past 2.4 GB: bound each probe, so a regression fails, not the host.
MEMORY = 1 << 30


def _bounded_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


RUN = ("run", "--policy", "p.toml", "--ledger-dir", "{dir}/out", "--", "true")
TEST_PUBKEY = (
    Path(__file__).resolve().parent.parent / "spec/vectors/attest-key/TEST-ONLY-ed25519.pem.pub"
).read_bytes()
CHAOS = ("chaos", "--seed", "1", "--dir", "{dir}/out")
SCENARIO = (*CHAOS, "--scenario", "s.yaml")
AGENT = ("agent", "--base-url", "http://127.0.0.1:9/openai/v1")
AGENT_ENV = (("OPENAI_API_KEY", "dkt-test-token"),)
GAME_DAY = ("game-day", "--phase", "01-upstream-failure.yaml", "--report", "{dir}/out")

CASES = [
    # -- the policy (docket run --policy)
    Case("base_url port 99999", RUN, "must have a port from 1 to 65535",
         _base_url("http://127.0.0.1:99999"), before=EXIT_70),
    Case("base_url port abc", RUN, "must have a port from 1 to 65535",
         _base_url("http://127.0.0.1:abc"), before=EXIT_70),
    Case("base_url port -1", RUN, "must have a port from 1 to 65535",
         _base_url("http://127.0.0.1:-1"), before=EXIT_70),
    Case("base_url unclosed [", RUN, "unclosed [", _base_url("http://[::1"), before=EXIT_70),
    Case("base_url unbracketed IPv6", RUN, "IPv6 address in brackets", _base_url("http://::1:80"),
         before=WRONG),
    Case("base_url port 0", RUN, "must have a port from 1 to 65535", _base_url("http://x:0"),
         before=WRONG),
    Case("base_url userinfo", RUN, "user:password@", _base_url("http://u:p@example.com"),
         before=WRONG),
    Case("base_url bad host", RUN, "not a valid host name", _base_url("http://bad_host"),
         before=WRONG),
    Case("policy arrays 3000 deep", RUN, "nested too deeply",
         _policy("x = " + "[" * 3000 + "]" * 3000 + "\n"), before=EXIT_70),
    Case("policy tables 3000 deep", RUN, "nested too deeply",
         _policy("x = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n"), before=EXIT_70),
    Case("policy duration with a fullwidth digit", RUN, "caps.max_wall_seconds",
         _policy('[caps]\nmax_wall_seconds = "１s"\n'), before=WRONG),
    Case("policy duration past ten years", RUN, "at most ten years",
         _policy('[caps]\nmax_wall_seconds = "99999999999h"\n'), before=WRONG),
    Case("policy duration inf", RUN, "caps.max_wall_seconds", _policy("[caps]\nmax_wall_seconds = inf\n")),
    Case("policy size with a fullwidth digit", RUN, "ledger.max_ledger_bytes",
         _policy('[ledger]\nmax_ledger_bytes = "１MiB"\n'), before=WRONG),
    Case("policy binary", RUN, "binary data", {"p.toml": b"\x00\x01"}),
    Case("policy [explain] with a mistyped key", RUN, "explain.retry_min_recall: unknown key",
         _policy("[explain]\nretry_min_recall = 3\n"), before=WRONG),
    Case("policy [explain] threshold as text", RUN, "explain.loop_min_calls: must be a whole",
         _policy('[explain]\nloop_min_calls = "ten"\n'), before=WRONG),
    Case("policy empty", RUN, "is empty", {"p.toml": b""}),
    Case("policy missing", RUN, "no such file"),
    Case("policy not UTF-8", RUN, "not UTF-8", {"p.toml": b"x = '\xff'\n"}),
    Case("policy over 16 MiB", RUN, "more than the 16 MiB", {"p.toml": b"#" * (17 << 20)}),
    Case("ledger folder is a file", ("run", "--ledger-dir", "a-file", "--", "true"),
         "cannot create", {"a-file": "x"}),
    # -- the fault grammar (docket chaos --fault)
    Case("retry_after with an offset", (*CHAOS, "--fault",
         'upstream:status(429, retry_after="Wed, 21 Oct 2015 07:28:00 +0100 GMT")'),
         "is not an HTTP date", before=EXIT_70),
    Case("retry_after with a 27-digit year", (*CHAOS, "--fault",
         'upstream:status(429, retry_after="Wed, 21 Oct 201500000000000000000000000 07:28:00 GMT")'),
         "is not an HTTP date", before=EXIT_70),
    Case("retry_after across lines", (*CHAOS, "--fault",
         'upstream:status(429, retry_after="x\ny")'), "'x\\ny' is not an HTTP date", before=EXIT_70),
    Case("retry_after with a line break inside a good date", (*CHAOS, "--fault",
         'upstream:status(429, retry_after="Wed, 21 Oct\n2015 07:28:00 GMT")'), "not an HTTP date",
         before=WRONG),
    Case("retry_after on 31 February", (*CHAOS, "--fault",
         'upstream:status(429, retry_after="Tue, 31 Feb 2015 07:28:00 GMT")'), "day is out of range"),
    Case("clock step of 25 digits", (*CHAOS, "--fault", "clock:step(-3099999999999999999999999s)"),
         "has more than 15 digits", before=EXIT_70),
    Case("clock step past ten years", (*CHAOS, "--fault", "clock:step(-315360001s)"),
         "at most ten years", before=EXIT_70),
    Case("fullwidth digit in a call range", (*CHAOS, "--fault", "upstream:status(500)@call 1..５"),
         "found '５'", before=EXIT_70),
    Case("fullwidth digit as a call", (*CHAOS, "--fault", "upstream:status(500)@call ５"),
         "expected a call number", before=EXIT_70),
    Case("fullwidth digit as a percentage", (*CHAOS, "--fault", "upstream:status(500)@５%"),
         "expected a percentage", before=EXIT_70),
    Case("fullwidth digit in a duration", (*CHAOS, "--fault", "upstream:latency(１s)"),
         "expected a duration", before=WRONG),
    Case("a 5000-digit call number", (*CHAOS, "--fault", "upstream:status(500)@call " + "9" * 5000),
         "more than 15 digits", before=EXIT_70),
    Case("a 20-digit truncate", (*CHAOS, "--fault", "upstream:truncate(after=" + "9" * 20 + ")"),
         "more than 15 digits", before=WRONG),
    Case("an empty fault", (*CHAOS, "--fault", ""), "expected a target"),
    Case("a fault holding a control character", (*CHAOS, "--fault", "upstream:status(500)\x1b[2J"),
         "\\x1b"),
    # -- scenarios (docket chaos --scenario)
    Case("scenario alias bomb", SCENARIO, "alias *a refused", {"s.yaml": _alias_bomb("seed")},
         before=EXIT_70),
    Case("scenario self-recursive alias", SCENARIO, "alias *a refused",
         {"s.yaml": "seed: &a [*a]\n"}, before=EXIT_70),
    Case("scenario 3000 deep", SCENARIO, "nested more than 64 levels deep",
         {"s.yaml": "seed: " + "[" * 3000 + "]" * 3000 + "\n"}, before=EXIT_70),
    Case("scenario NUL in an agent command", SCENARIO, "must not hold a NUL byte",
         {"s.yaml": 'agents:\n  - command: ["true", "a\\0b"]\n'}, before=EXIT_70),
    Case("scenario NUL in an agent setting", SCENARIO, "must not hold a NUL byte",
         {"s.yaml": 'agents:\n  - env: {DOCKET_AGENT_MODEL: "a\\0b"}\n'}, before=WRONG),
    Case("scenario 5000-digit number", SCENARIO, "a number of more than 32 characters",
         {"s.yaml": "seed: " + "9" * 5000 + "\n"}, before=EXIT_70),
    Case("scenario latency .inf", SCENARIO, "providers[0].latency",
         {"s.yaml": "providers: [{latency: .inf}]\n"}),
    Case("scenario timeout past ten years", SCENARIO, "agents[0].timeout",
         {"s.yaml": "agents: [{timeout: 999999999999s}]\n"}, before=WRONG),
    Case("scenario calls past 2^31", SCENARIO, "agents[0].calls",
         {"s.yaml": "agents: [{calls: 99999999999999999999}]\n"}, before=WRONG),
    Case("scenario policy nested in its boundary", SCENARIO, "boundary.host: must be a non-empty string",
         {"s.yaml": "policy: {boundary: {host: [[[[1]]]]}}\n"}),
    Case("scenario binary", SCENARIO, "binary data", {"s.yaml": b"seed: \x00"}),
    Case("scenario empty", SCENARIO, "is empty", {"s.yaml": b""}),
    Case("scenario python tag", SCENARIO, "could not determine a constructor",
         {"s.yaml": "seed: !!python/object:os.system x\n"}),
    Case("scenario over 1 MiB", SCENARIO, "more than the 1 MiB", {"s.yaml": b"#" * (2 << 20)}),
    Case("chaos folder is a file", ("chaos", "--seed", "1", "--dir", "a-file"), "cannot create",
         {"a-file": "x"}),
    # -- game-day phases (docket game-day --phase FILE)
    Case("phase 2000-deep JMESPath", GAME_DAY, "nested more than 64 deep",
         _phase("length(injected[?kind=='status'])", DEEP_QUERY.replace("'", "")), before=EXIT_70),
    Case("phase 3000 '!' JMESPath", GAME_DAY, "nested more than 64 deep",
         _phase("length(injected[?kind=='status'])", "!" * 3000 + "a"), before=EXIT_70),
    Case("phase alias bomb", GAME_DAY, "alias *a refused",
         {"01-upstream-failure.yaml": _alias_bomb("x")}, before=EXIT_70),
    Case("phase self-recursive alias", GAME_DAY, "alias *a refused",
         _phase("seed: 101", "seed: &a [*a]"), before=EXIT_70),
    Case("phase NUL in an agent command", GAME_DAY, "must not hold a NUL byte",
         _phase("{name: looper, mode: loop,", '{name: looper, command: ["a\\0"],'), before=EXIT_70),
    Case("phase budget .inf", GAME_DAY, "budget", _phase("budget: 20s", "budget: .inf")),
    Case("phase bad regex", GAME_DAY, "not a regular expression",
         _phase("at_least: 1", 'matches: "(("')),
    Case("phase missing", GAME_DAY, "no such file"),
    Case("phase operand .nan", GAME_DAY, "at_least needs a number, not NaN",
         _phase("at_least: 1", "at_least: .nan"), before=WRONG),
    Case("phase empty", GAME_DAY, "is empty", {"01-upstream-failure.yaml": b""}),
    Case("phase binary", GAME_DAY, "binary data", {"01-upstream-failure.yaml": b"name: \x00"}),
    Case("phase report folder is a file", (*GAME_DAY[:-1], "a-file"), "--report",
         {**_phase("seed: 101", "seed: 102"), "a-file": "x"}, untouched=()),
    # -- docket verify
    Case("receipt naming a ledger with a NUL", ("verify", "r.json"), "cannot hold a NUL byte",
         {"r.json": "RECEIPT_WITH_NUL"}, before=EXIT_70),
    # -- docket stub
    Case("stub latency with a fullwidth digit", ("stub", "--latency", "１s"), "not a duration",
         before=WRONG),
    Case("stub latency past ten years", ("stub", "--latency", "99999999999999999999999m"),
         "not a duration", before=WRONG),
    Case("stub port 99999", ("stub", "--port", "99999"), "not a port number"),
    Case("stub log is a folder", ("stub", "--log", "."), "cannot append"),
    # -- docket init and docket demo
    Case("init over a FIFO", ("init", "fifo", "--force"), "not a regular file", {"fifo": "FIFO"},
         before=WRONG),
    Case("init over a folder", ("init", "."), "is a directory"),
    Case("demo into a file", ("demo", "--dir", "a-file"), "cannot make the folder",
         {"a-file": "x"}, before=EXIT_70),
    Case("selftest --only a check that is not one", ("selftest", "--only", "x\x1b[2J"),
         "no such check or group"),
    Case("selftest --only with no name", ("selftest", "--only"), "expected one argument"),
    # -- docket agent
    Case("agent base URL unclosed [", ("agent", "--base-url", "http://[::1"), "base"),
    Case("agent calls with a fullwidth digit", (*AGENT, "--calls", "５"), "calls", env=AGENT_ENV,
         before=WRONG),
    Case("agent timeout nan", (*AGENT, "--timeout", "nan"), "timeout", env=AGENT_ENV),
    # -- docket run's own flags
    Case("run --max-wall-clock nan", ("run", "--max-wall-clock", "nan", "--", "true"),
         "--max-wall-clock"),
    Case("run --grace -1", ("run", "--grace", "-1", "--", "true"), "--grace"),
    # Python's float() and int() read any Unicode digit: a flag reads ASCII only
    Case("run --max-wall-clock in fullwidth digits", ("run", "--max-wall-clock", "５", "--",
         "true"), "--max-wall-clock", before=WRONG),
    Case("run --grace in Arabic-Indic digits", ("run", "--grace", "٥", "--", "true"), "--grace",
         before=WRONG),
    Case("stub --port in Arabic-Indic digits", ("stub", "--port", "٨٠"), "--port", before=WRONG),
    Case("chaos --seed with an exponent", ("chaos", "--seed", "1e3", "--", "true"), "--seed"),
    # -- docket run --snapshot and docket restore
    Case("run --snapshot of /proc", ("run", "--snapshot=/proc", "--", "true"), "nothing under /proc"),
    Case("run --snapshot of a missing folder", ("run", "--snapshot=nowhere", "--", "true"),
         "cannot read"),
    Case("run --rollback-on-breach alone", ("run", "--rollback-on-breach", "--", "true"),
         "needs --snapshot"),
    Case("restore a folder with no ledger", ("restore", "."), "no ledger.jsonl"),
    Case("restore a binary ledger", ("restore", "."), "chain does not hold",
         {"ledger.jsonl": b"\x00\xff\n"}),
    Case("restore an empty ledger", ("restore", "."), "took no snapshot", {"ledger.jsonl": b""}),
    Case("restore --only ..", ("restore", ".", "--only", "../x"), "--only",
         {"ledger.jsonl": b""}),
    # -- reading a run: explain, show, diff (tests/test_reading_inputs.py has the rest)
    Case("explain a binary ledger", ("explain", "l.jsonl"), "not a docket ledger",
         {"l.jsonl": b"\x00\xff\n"}),
    Case("explain an empty ledger", ("explain", "l.jsonl"), "is empty", {"l.jsonl": b""}),
    Case("explain 500-deep JSON", ("explain", "l.jsonl"), "not a docket ledger",
         {"l.jsonl": "[" * 500 + "]" * 500 + "\n"}),
    Case("show a missing ledger", ("show", "nowhere.jsonl"), "no such file"),
    Case("show --seq backwards", ("show", "l.jsonl", "--seq", "9..2"), "ends before it starts",
         {"l.jsonl": b""}),
    Case("diff a binary receipt", ("diff", "a.json", "a.json"), "binary data",
         {"a.json": b"\x00\xff"}),
    Case("diff a folder with no receipt", ("diff", ".", "."), "no receipt.json in this folder",
         {"ledger.jsonl": b""}),
    # -- export otel (tests/test_export_otel.py has the rest; nothing is sent for these)
    Case("export a missing ledger", ("export", "otel", "nowhere.jsonl"), "no such file"),
    Case("export an empty ledger", ("export", "otel", "l.jsonl"), "is empty", {"l.jsonl": b""}),
    Case("export a binary ledger", ("export", "otel", "l.jsonl"), "not a docket ledger",
         {"l.jsonl": b"\x00\xff\n"}),
    Case("export a torn line", ("export", "otel", "l.jsonl"), "malformed_line",
         {"l.jsonl": b'{"v":1\n'}),
    # -- replay (tests/test_replay_recording.py and chaos/attack/replay.py have the rest)
    Case("replay a missing run", ("replay", "nowhere", "--", "true"), "no such folder"),
    Case("replay a folder with no receipt", ("replay", "{dir}", "--", "true"), "receipt.json",
         {"ledger.jsonl": b""}),
    Case("replay with no command", ("replay", "{dir}"), "give the command to run after --"),
    Case("replay --on-miss bogus", ("replay", "--on-miss", "bogus", "{dir}", "--", "true"),
         "invalid choice"),
    # -- prune (tests/test_snapshot_prune.py has the rest; nothing is removed for these)
    Case("prune a missing store", ("prune", "nowhere"), "no store here"),
    Case("prune --older-than nonsense", ("prune", "{dir}", "--older-than", "soon"), "--older-than"),
    Case("prune --max-size nonsense", ("prune", "{dir}", "--max-size", "big"), "--max-size"),
    # -- fleet (tests/test_fleet_command.py has the rest, against a real PostgreSQL)
    Case("fleet with no action", ("fleet",), "name an action"),
    Case("fleet status with no name", ("fleet", "status"), "required: name"),
    Case("fleet with no database named", ("fleet", "budget", "set", "x", "--max-usd", "1"),
         "DOCKET_FLEET_DSN is not set", env=(("DOCKET_FLEET_DSN", ""),)),
    # -- listing runs: ls (tests/test_runs_list.py has the rest)
    Case("ls a missing folder", ("ls", "nowhere"), "no such folder"),
    Case("ls a file", ("ls", "f.txt"), "not a folder", {"f.txt": "x"}),
    # -- attestations (tests/test_attest.py has the rest)
    Case("keygen into a missing folder", ("keygen", "--out", "{dir}/out/k.pem"), "no such folder"),
    Case("keygen over a file", ("keygen", "--out", "k.pem"), "already exists", {"k.pem": "mine"}),
    Case("attest with a key others can read", ("attest", "{dir}", "--key", "k.pem"),
         "lets group or others read it", {"k.pem": "not a key"}),
    Case("attest with a missing key", ("attest", "{dir}", "--key", "none.pem"), "no such file"),
    Case("verify a binary attestation",
         ("verify", "{dir}", "--attestation", "a.json", "--pubkey", "k.pub"),
         "(attestation_not_json)", {"a.json": b"\x00\xff", "k.pub": TEST_PUBKEY}),
    Case("verify with a public key that is not one",
         ("verify", "{dir}", "--attestation", "a.json", "--pubkey", "k.pub"),
         "(pubkey_unreadable)", {"a.json": "{}", "k.pub": "-----BEGIN PUBLIC KEY-----\n"}),
]  # fmt: skip


def _prepare(case: Case, folder: Path) -> Case:
    """Files that cannot be written as text: a FIFO, a receipt naming a NUL file."""
    files = dict(case.files)
    if files.get("fifo") == "FIFO":
        del files["fifo"]
        os.mkfifo(folder / "fifo")
    if files.get("r.json") == "RECEIPT_WITH_NUL":
        files["r.json"] = json.dumps(_receipt_naming("led\x00ger.jsonl"))
    return Case(case.id, case.argv, case.fragment, files, case.before, case.untouched, case.env)


def _receipt_naming(ledger_file: str) -> dict:
    """A real receipt (from the demo's recorded run) with its ledger.file replaced."""
    import tempfile

    import trio

    from docket.demo import record_run

    with tempfile.TemporaryDirectory() as tmp:
        _ledger, receipt = trio.run(record_run, Path(tmp))
        data = json.loads(receipt.read_text(encoding="utf-8"))
    data["ledger"]["file"] = ledger_file
    return data


# A dozen rows, one per verb family, also as `python -m docket`: what the interpreter's
# start adds (the -m entry, every import a verb makes) is probed by a real one.
INTERPRETER = {
    "policy missing", "policy arrays 3000 deep", "scenario alias bomb", "phase alias bomb",
    "a 5000-digit call number", "receipt naming a ledger with a NUL", "stub port 99999",
    "init over a FIFO", "agent timeout nan", "run --grace -1", "restore a binary ledger",
    "explain a binary ledger", "diff a binary receipt",
}  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_input_is_one_line_and_exit_2(case: Case, tmp_path: Path):
    run_case(_prepare(case, tmp_path), tmp_path)


@pytest.mark.parametrize("name", sorted(INTERPRETER))
def test_hostile_input_through_the_interpreter(name: str, tmp_path: Path):
    case = next(c for c in CASES if c.id == name)
    run_case(_prepare(case, tmp_path), tmp_path, interpreter=True)


def test_every_verb_is_probed():
    """A verb added to `docket --help` joins this table."""
    from docket.cli import build_parser

    verbs = set(build_parser()._subparsers._group_actions[0].choices)
    probed = {case.argv[0] for case in CASES}
    assert verbs - probed <= {"doctor", "prices"}, verbs - probed  # doctor: test_cli_inputs.py
