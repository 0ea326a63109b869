"""Family `inputs`: bad CLI arguments, policies, faults, scenarios and phases, and
hostile ledgers where `docket export otel` reads one (chaos/attack/ledgers.py).

Each probe is a real `python -m docket ...` process handed one bad input, run
under a memory bound (RLIMIT_AS) and a CPU bound so that an alias bomb or a
runaway parse ends as a refusal or a visible failure, never a machine stall.
Good: exit 2, exactly one line on stderr starting `docket: `, no traceback, and
nothing half-written (a refused `docket run` or `docket chaos` leaves no ledger).
Control probes (each template unspoiled, under the same bounds) must succeed, so the
template or the bounds are never what refuses.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from chaos.attack import Figures
from chaos.attack.ledgers import NOWHERE, good_ledger, ledger_cases
from chaos.attack.rig import DOCKET, KEY_ENV, run_env

MEMORY_BOUND = 512 << 20  # bytes of address space per probe: room for docket (the controls
# prove it), not for a bomb
CPU_BOUND = 30  # seconds of CPU per probe
TIMEOUT = 60.0  # seconds of wall clock per probe (2 shared cores)
STUB_TIMEOUT = 15.0  # `docket stub` serves until stopped: past this, it took the input
GOOD = (
    f'[providers.openai]\nkind = "openai"\nbase_url = "http://127.0.0.1:9"\nkey_env = "{KEY_ENV}"\n'
)


@dataclass
class CommandProbe:
    name: str
    argv: list[str]  # after `docket`; {d} is the probe's own folder
    files: dict[str, bytes] = field(default_factory=dict)  # written into {d} first
    env: dict[str, str] = field(default_factory=dict)
    quick: bool = False  # part of the quick form
    want: int = 2  # the controls want 0
    timeout: float = TIMEOUT  # shorter for a verb that, accepting its input, serves forever


# Sets the bounds, then becomes the command. A launcher process rather than
# subprocess's preexec_fn, which is unsafe once probes run from several threads.
BOUNDED = """\
import os, resource, sys
memory, cpu = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
os.execv(sys.argv[3], sys.argv[3:])
"""
WORKERS = 3  # probes at once: most wait on a process start, not on a core


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The classic billion-laughs YAML: under 1 KiB, width**levels leaves expanded."""
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for n in range(1, levels):
        lines.append(f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def policy(name: str, text: str | bytes, quick: bool = False, **kw) -> CommandProbe:
    data = text if isinstance(text, bytes) else text.encode()
    return CommandProbe(f"policy: {name}", ["run", "--policy", "{d}/p.toml", "--ledger-dir", "{d}/run",
                 "--", "true"], {"p.toml": data}, quick=quick, **kw)  # fmt: skip


def fault(spec: str, quick: bool = False) -> CommandProbe:
    return CommandProbe(f"fault: {spec[:60]!r}", ["chaos", "--dir", "{d}/run", "--fault", spec, "--",
                 "true"], quick=quick)  # fmt: skip


def scenario(name: str, text: str | bytes, quick: bool = False) -> CommandProbe:
    data = text if isinstance(text, bytes) else text.encode()
    return CommandProbe(f"scenario: {name}", ["chaos", "--dir", "{d}/run", "--scenario", "{d}/s.yaml"],
                 {"s.yaml": data}, quick=quick)  # fmt: skip


def phase(name: str, text: str | bytes, quick: bool = False) -> CommandProbe:
    data = text if isinstance(text, bytes) else text.encode()
    # The file is named for the phase: a phase whose name differs from its file is refused
    # for that alone, and a probe must be refused for its own flaw (the controls check it).
    return CommandProbe(f"phase: {name}", ["game-day", "--phase", "{d}/attack-probe.yaml", "--json",
                 "{d}/o.json", "--junit", "{d}/o.xml", "--report", "{d}/report"],
                 {"attack-probe.yaml": data}, quick=quick)  # fmt: skip


def export(name: str, ledger: bytes, quick: bool = False) -> CommandProbe:
    return CommandProbe(f"ledger: {name}", ["export", "otel", "{d}/ledger.jsonl", "--endpoint",
                 NOWHERE, "--timeout", "2"], {"ledger.jsonl": ledger}, quick=quick)  # fmt: skip


SCENARIO = 'seed: 1\nfaults: ["upstream:status(503)@call 2"]\nagents:\n  - {name: a, mode: once}\n'
PHASE = """\
name: attack-probe
title: a probe
fmea: [F01]
seed: 1
mode: in-process
budget: 20s
run:
  providers: [{name: openai, kind: openai}]
  agents: [{name: a, mode: once, provider: openai}]
  max_wall_clock: 10s
expect:
  - {name: q, query: "QUERY", is_true: true}
"""


def probes() -> list[CommandProbe]:
    junk = random.Random(11).randbytes(4096)
    deep = "[" * 3000 + "]" * 3000
    g = GOOD
    table = [
        # the command line
        CommandProbe("cli: run -- ''", ["run", "--ledger-dir", "{d}/run", "--", ""], quick=True),
        CommandProbe("cli: run with no command", ["run", "--ledger-dir", "{d}/run"]),
        CommandProbe("cli: --max-wall-clock abc", ["run", "--ledger-dir", "{d}/run",
              "--max-wall-clock", "abc", "--", "true"]),
        CommandProbe("cli: --max-wall-clock -1", ["run", "--ledger-dir", "{d}/run",
              "--max-wall-clock", "-1", "--", "true"]),
        CommandProbe("cli: --max-wall-clock nan", ["run", "--ledger-dir", "{d}/run",
              "--max-wall-clock", "nan", "--", "true"]),
        CommandProbe("cli: --max-wall-clock 1e400", ["run", "--ledger-dir", "{d}/run",
              "--max-wall-clock", "1e400", "--", "true"]),
        CommandProbe("cli: --max-wall-clock in fullwidth digits", ["run", "--ledger-dir", "{d}/run",
              "--max-wall-clock", "\uff15", "--", "true"]),
        CommandProbe("cli: --grace -1", ["run", "--ledger-dir", "{d}/run", "--grace", "-1", "--", "true"]),
        CommandProbe("cli: --grace inf", ["run", "--ledger-dir", "{d}/run", "--grace", "inf", "--", "true"]),
        CommandProbe("cli: --budget-mode bogus", ["run", "--budget-mode", "bogus", "--", "true"]),
        CommandProbe("cli: stub --port 99999", ["stub", "--port", "99999"], timeout=STUB_TIMEOUT),
        CommandProbe("cli: stub --port -1", ["stub", "--port", "-1"], timeout=STUB_TIMEOUT),
        CommandProbe("cli: stub --latency 5x", ["stub", "--latency", "5x"], timeout=STUB_TIMEOUT),
        CommandProbe("cli: stub --latency in Arabic-Indic digits", ["stub", "--latency", "\u0665ms"], timeout=STUB_TIMEOUT),
        CommandProbe("cli: chaos --seed abc", ["chaos", "--dir", "{d}/run", "--seed", "abc", "--", "true"]),
        CommandProbe("cli: init into a missing folder", ["init", "{d}/no/such/folder/docket.toml"]),
        CommandProbe("cli: verify a receipt whose ledger.file holds NUL", ["verify", "{d}/r.json"],
              {"r.json": NUL_RECEIPT}, quick=True),
        CommandProbe("cli: doctor a binary file", ["doctor", "{d}/b"], {"b": junk}),
        CommandProbe("cli: verify an empty receipt", ["verify", "{d}/e"], {"e": b""}),
        CommandProbe("cli: provider key with CR/LF", ["run", "--policy", "{d}/p.toml", "--ledger-dir",
              "{d}/run", "--", "true"], {"p.toml": g.encode()},
              env={KEY_ENV: "sk-good\r\nX-Injected: 1"}, quick=True),
        # the policy
        CommandProbe("policy: missing", ["run", "--policy", "{d}/missing.toml", "--", "true"]),
        CommandProbe("policy: a directory", ["run", "--policy", "{d}", "--", "true"]),
        policy("binary", junk),
        policy("malformed TOML", "[providers.openai\nkind = 1\n"),
        policy("huge (20 MB, not TOML)", b"a" * 20_000_000),
        policy("NUL byte", g.replace('"openai"', '"open\x00ai"', 1)),
        policy("UTF-16 with BOM", g.encode("utf-16")),
        policy("nested 3000 deep (arrays)", f"{g}x = {deep}\n", quick=True),
        policy("nested 3000 deep (tables)", f"{g}x = " + "{a=" * 3000 + "1" + "}" * 3000 + "\n"),
        policy("base_url port 99999", g.replace(":9", ":99999")),
        policy("base_url port abc", g.replace(":9", ":abc")),
        policy("base_url port -1", g.replace(":9", ":-1")),
        policy("base_url http://[::1", g.replace("http://127.0.0.1:9", "http://[::1")),
        policy("base_url ftp://", g.replace("http://", "ftp://")),
        # An IPv6 boundary host is bracketed where URLs are built: it must work, not be refused.
        policy("boundary host ::1 unbracketed (works)", g + '[boundary]\nhost = "::1"\n',
               quick=True, want=0),
        policy("boundary port 70000", g + "[boundary]\nport = 70000\n"),
        policy("boundary port as fullwidth text", g + '[boundary]\nport = "\uff18\uff10"\n'),
        policy("upstream_timeout -1", g + "[boundary]\nupstream_timeout = -1\n"),
        policy("upstream_timeout inf", g + "[boundary]\nupstream_timeout = inf\n"),
        policy("upstream_timeout nan", g + "[boundary]\nupstream_timeout = nan\n"),
        policy("upstream_timeout huge", g + '[boundary]\nupstream_timeout = "-3099999999999999999999999s"\n'),
        policy("max_ledger_bytes huge", g + '[ledger]\nmax_ledger_bytes = "99999999999999999999999TiB"\n'),
        policy("min_free_bytes abc", g + '[ledger]\nmin_free_bytes = "abc"\n'),
        policy("max_usd -1", g + "[caps]\nmax_usd = -1\n"),
        policy("warn_at 2", g + "[caps]\nwarn_at = 2\n"),
        policy("max_model_calls true", g + "[caps]\nmax_model_calls = true\n"),
        policy("max_model_calls 1.5", g + "[caps]\nmax_model_calls = 1.5\n"),
        policy("unknown section", g + "[bogus]\nx = 1\n"),
        policy("unknown provider key", g + "colour = 1\n"),
        policy("key_env empty", g.replace(f'"{KEY_ENV}"', '""')),
        policy("key_env with =", g.replace(f'"{KEY_ENV}"', '"A=B"')),
        policy("provider kind nonsense", g.replace('kind = "openai"', 'kind = "nonsense"')),
        policy("egress allow [123]", g + "[egress]\nallow = [123]\n"),
        # the fault grammar
        fault('upstream:status(429, retry_after="Wed, 21 Oct 2015 07:28:00 +0100 GMT")'),
        fault('upstream:status(429, retry_after="Wed, 21 Oct 201500000000000000000000000 07:28:00 GMT")'),
        fault("clock:step(-3099999999999999999999999s)", quick=True),
        fault("upstream:status(503)@call 1..\uff15"),
        fault("upstream:status(99999)"),
        fault("upstream:status(503)@150%"),
        fault("bogus:thing"),
        fault("upstream:status("),
        fault("net:timeout(1e400)"),
        fault("upstream:latency(-1s)"),
        fault("upstream:status(503)@call 5..2"),
        fault(""),
        fault('upstream:status(429, retry_after="Wed,\nno such date\nat all")'),
        fault("upstream:status(" * 3000),
        fault("upstream:status(503)@" + "call 1 & " * 2000 + "call 1"),
        # scenarios
        scenario("missing", b"", quick=False) | _missing("s.yaml"),
        scenario("empty", b""),
        scenario("binary", junk),
        scenario("malformed YAML", "seed: [1\nagents: {\n"),
        scenario("huge (20 MB scalar)", b"seed: " + b"9" * 20_000_000 + b"\n"),
        scenario("alias bomb (9x9)", alias_bomb() + SCENARIO, quick=True),
        scenario("seed: &a [*a]", "seed: &a [*a]\n" + SCENARIO.split("\n", 1)[1]),
        scenario("nested 3000 deep", f"seed: 1\nx: {deep}\n"),
        scenario("NUL in the agent command", SCENARIO.replace(
            "{name: a, mode: once}", '{name: a, command: ["python\\0", "-c", "pass"]}')),
        scenario("unknown key", SCENARIO + "bogus: 1\n"),
        scenario("seed abc", SCENARIO.replace("seed: 1", "seed: abc")),
        scenario("max_wall_clock -5s", SCENARIO + "max_wall_clock: -5s\n"),
        scenario("fault with fullwidth digit", SCENARIO.replace("call 2", "call \uff12")),
        scenario("tagged object", SCENARIO + "x: !!python/object/apply:os.system ['true']\n"),
        # game-day phases
        phase("2000-deep JMESPath", PHASE.replace("QUERY", "(" * 2000 + "`true`" + ")" * 2000),
              quick=True),
        phase("2000-deep JMESPath, brackets", PHASE.replace("QUERY", "[" * 2000 + "]" * 2000)),
        phase("alias bomb (9x9)", alias_bomb() + PHASE.replace("QUERY", "`true`")),
        phase("seed: &a [*a]", PHASE.replace("seed: 1", "seed: &a [*a]").replace("QUERY", "`true`")),
        phase("malformed JMESPath", PHASE.replace("QUERY", "[[[")),
        phase("empty", b""),
        phase("binary", junk),
        phase("budget -1s", PHASE.replace("budget: 20s", "budget: -1s").replace("QUERY", "`true`")),
        phase("unknown mode", PHASE.replace("in-process", "sideways").replace("QUERY", "`true`")),
    ]  # fmt: skip
    # ledgers a same-user agent can plant where `docket export otel` reads (chaos/attack/ledgers.py)
    table += [export(name, data, quick) for name, data, quick in ledger_cases()]
    return table


def _missing(name: str):
    """A marker that drops a file from a probe: `scenario(...) | _missing(name)`."""
    return _Drop(name)


class _Drop:
    def __init__(self, name: str) -> None:
        self.name = name

    def __ror__(self, probe: CommandProbe) -> CommandProbe:
        probe.files.pop(self.name, None)
        return probe


NUL_RECEIPT = b"(made from the control run's receipt)"


def nul_receipt(control_dir: Path) -> bytes:
    """The control run's real receipt with only ledger.file changed to hold a NUL."""
    receipt = json.loads((control_dir / "run" / "receipt.json").read_text())  # the policy control's
    receipt["ledger"]["file"] = "led\x00ger.jsonl"
    return json.dumps(receipt, indent=2).encode()


def controls() -> list[CommandProbe]:
    """The templates the probes spoil, unspoiled, under the same bounds: each must exit 0,
    so a probe is refused for the flaw it carries, not the template or the bounds."""
    good = [
        policy("control: a good policy", GOOD),
        fault("upstream:status(503)@call 2"),
        scenario("control: a good scenario", SCENARIO),
        phase("control: a good phase", PHASE.replace("QUERY", "`true`")),
    ]
    for probe in good:
        probe.want = 0
    # A well-formed ledger is read, then not taken: nothing listens at NOWHERE (exit 1).
    accepted = export("control: a good ledger", good_ledger())
    accepted.want = 1
    return [*good, accepted]


def attempt(probe: CommandProbe, folder: Path) -> tuple[bool, str]:
    """Run one probe in `folder`; (good?, what happened in one line, starting with
    `exit N` or `timeout`)."""
    folder.mkdir(parents=True)
    for name, data in probe.files.items():
        (folder / name).write_bytes(data)
    argv = [a.replace("{d}", str(folder)) for a in probe.argv]
    env = run_env(**probe.env)
    env["MALLOC_ARENA_MAX"] = "2"  # glibc reserves 64 MiB of address space per arena otherwise
    try:
        bounded = [sys.executable, "-c", BOUNDED, str(MEMORY_BOUND), str(CPU_BOUND)]
        done = subprocess.run([*bounded, *DOCKET, *argv], capture_output=True, timeout=probe.timeout,
                              env=env, stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        return (
            False,
            f"timeout: no answer within {probe.timeout:.0f} s (killed)",
        )
    err = done.stderr.decode("utf-8", "replace")
    lines = err.splitlines()
    problems = []
    problems.append(f"exit {done.returncode}")
    if probe.want == 2:
        if "Traceback" in err:
            problems.append("a traceback")
        if len(lines) != 1 or not err.endswith("\n"):
            problems.append(f"{len(lines)} stderr lines")
        elif not err.startswith("docket: "):
            problems.append("stderr does not start with 'docket: '")
        if any((folder / "run").rglob("*.jsonl")):
            problems.append("a ledger was left behind")
    first = lines[0][:160] if lines else "(stderr empty)"
    return problems == [f"exit {probe.want}"], f"{'; '.join(problems)}: {first}"


def run(folder: Path, quick: bool) -> Figures:
    figures = Figures("inputs")
    base = folder / "inputs"
    with ThreadPoolExecutor(WORKERS) as pool:
        checked = list(
            pool.map(lambda n: attempt(controls()[n], base / f"control{n}"), range(len(controls())))
        )
    for probe, (ok, said) in zip(controls(), checked, strict=True):
        if not ok:
            raise RuntimeError(f"a control input failed ({probe.name}): {said}")
    chosen = [p for p in probes() if p.quick or not quick]
    for probe in chosen:
        for name, data in probe.files.items():
            if data is NUL_RECEIPT:
                probe.files[name] = nul_receipt(base / "control0")
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(
            pool.map(lambda n: attempt(chosen[n], base / f"p{n:03d}"), range(len(chosen)))
        )
    by_exit: dict[str, int] = {}
    for probe, (good, said) in zip(chosen, results, strict=True):
        key = said.split(";", 1)[0].split(":", 1)[0]  # "exit N" or "timeout"
        by_exit[key] = by_exit.get(key, 0) + 1
        argv = " ".join(_quote(a) for a in probe.argv)
        files = (
            f" with {', '.join(f'{k}={_preview(v)}' for k, v in probe.files.items())}"
            if probe.files
            else ""
        )
        env = f" env {probe.env!r}" if probe.env else ""
        figures.add(good, f"inputs {probe.name}: docket {argv}{files}{env} -> {said}")
    figures.extra = {
        "exit_codes": dict(sorted(by_exit.items())),
        "memory_bound_bytes": MEMORY_BOUND,
    }
    return figures


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_./{}=:" for c in arg) else repr(arg)


def _preview(data: bytes) -> str:
    return repr(data[:60]) + (f"...({len(data)} bytes)" if len(data) > 60 else "")
