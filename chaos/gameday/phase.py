"""Phase files: what one game-day phase runs and what it asserts, checked before anything starts.

A phase is a YAML file in gamedays/ (docs/gamedays.md has the schema). Every
key is checked here, and every mistake is one line, `FILE:LINE: at a.b[2] reason`,
raised as an InputError (exit 2) before any phase runs: an unknown key, a wrong
type, a bad duration, a query JMESPath cannot compile, an FMEA row the table
does not have, or a `run:` block the chaos engine refuses.

A phase holds one run (`run:`, a scenario block) or several (`runs:`, a list of
named scenario blocks run one after another, for a claim that needs two
policies, e.g. deny mode and kill mode); in a phase with several runs each
assertion names the run whose evidence it reads (`run: NAME`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib.resources.abc import Traversable
from pathlib import Path

from chaos.data.locate import folder as data_folder
from chaos.gameday.assertions import OPERATORS, Assertion, QueryError, compile_query
from chaos.gameday.assertions import operand_problem as _operand_problem
from chaos.gameday.fmea import fmea_rows
from chaos.gameday.your_agent import about_from_data, declaration_from_data
from chaos.yamldoc import Where, YamlError, load, loads
from docket.errors import InputError
from docket.fields import Fields
from docket.values import duration_seconds

MODES = ("in-process", "subprocess")
KEYS = ("name", "title", "fmea", "seed", "run", "runs", "mode", "budget", "expect", "your_agent")
REQUIRED = ("name", "title", "fmea", "seed", "expect")  # and exactly one of run, runs
EXPECT_KEYS = ("name", "query")
RUN_KEYS = ("name", "title", "run")
SINGLE_RUN = "run"  # the name of a phase's only run, written as `run:`
DEFAULT_BUDGET_S = 30.0
MAX_BUDGET_S = 600.0
MAX_SEED = 1 << 53  # the receipt keeps the seed as an exact JSON integer (chaos.scenario)

_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_FMEA_ID = re.compile(r"F[0-9]{2}")


@dataclass(frozen=True)
class Expectation:
    """An assertion, the run whose evidence it reads, and the line it was written on."""

    assertion: Assertion
    line: int
    run: str = SINGLE_RUN
    # Names of earlier checks on the same run that must pass for this one to mean
    # anything (`requires:`): "nothing forwarded while the breaker was open" holds
    # vacuously if it never opened, so it requires "the breaker opened".
    requires: tuple[str, ...] = ()
    # `about: agent`: a claim about the reference agent, not judged when the user's
    # own agent takes its place (chaos.gameday.your_agent)
    about: str = "boundary"


@dataclass(frozen=True)
class RunSpec:
    """One run of a phase: a name, a scenario, and the block as written."""

    name: str
    scenario: object  # chaos.scenario.Scenario
    data: Mapping  # the scenario block as written (subprocess mode hands it to `docket chaos`)
    title: str = ""
    line: int = 1


@dataclass(frozen=True)
class Phase:
    name: str
    title: str
    about: str  # the file's leading comment: what the phase shows
    fmea: tuple[str, ...]
    seed: int
    mode: str
    budget_s: float
    expect: tuple[Expectation, ...]
    runs: tuple[RunSpec, ...]
    source: str
    line: int = 1
    lines: Mapping[str, int] = field(default_factory=dict)  # top-level key -> line
    selected_run: str | None = None  # `--phase NAME:RUN` ran only this run of several
    # `your_agent:` (chaos.gameday.your_agent.Declaration), None when the file has none;
    # user_view: what running it with the user's agent changed, for the report
    your_agent: object = None
    user_view: Mapping = field(default_factory=dict)

    @property
    def assertions(self) -> tuple[Assertion, ...]:
        return tuple(e.assertion for e in self.expect)

    @property
    def several_runs(self) -> bool:
        """Written with `runs:` (even when one of them was selected to run alone)."""
        return self.selected_run is not None or len(self.runs) > 1

    @property
    def run(self):
        """The scenario of a phase with one run (chaos.scenario.Scenario)."""
        return self._only().scenario

    @property
    def run_data(self) -> Mapping:
        return self._only().data

    def _only(self) -> RunSpec:
        if len(self.runs) != 1:
            raise ValueError(f"phase {self.name} has {len(self.runs)} runs: name one")
        return self.runs[0]

    def repro(self, seed: int | None = None, run: str | None = None) -> str:
        """The command that runs this phase (or one of its runs) again with the same seed."""
        target = self.name if run is None else f"{self.name}:{run}"
        return f"docket game-day --phase {target} --seed {self.seed if seed is None else seed}"

    def only(self, run: str) -> Phase:
        """This phase with one of its runs and the assertions on it (`--phase NAME:RUN`)."""
        if not self.several_runs:
            raise InputError(f"phase {self.name} has one run: name the phase alone")
        chosen = [r for r in self.runs if r.name == run]
        if not chosen:
            names = ", ".join(r.name for r in self.runs)
            raise InputError(f"phase {self.name} has no run named {run!r}; its runs: {names}")
        return replace(
            self,
            runs=tuple(chosen),
            expect=tuple(e for e in self.expect if e.run == run),
            selected_run=run,
        )


# ---------------------------------------------------------------- values


def parse_duration(value: object) -> float | None:
    """Seconds from `20s`, `500ms`, `1.5m`, `1h` or a number of seconds; None if not one
    (docket.values' one duration grammar: ASCII digits, finite, bounded)."""
    return duration_seconds(value)


def leading_comment(text: str) -> str:
    """The comment lines at the top of a file, joined: a phase's own description."""
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            if stripped:
                break
            continue
        out.append(stripped.lstrip("#").strip())
    return " ".join(part for part in out if part)


def fmea_ids() -> frozenset[str] | None:
    """The FMEA table's row ids (docs/fmea.json via chaos.gameday.fmea)."""
    return frozenset(row.id for row in fmea_rows())


# ---------------------------------------------------------------- one file


def load_phase(path: str | os.PathLike, *, known_fmea: Iterable[str] | None = None) -> Phase:
    """Read and check one phase file; YamlError (exit 2) with file:line for any problem."""
    data, where = load(path)
    text = Path(path).read_text(encoding="utf-8")
    return phase_from_data(data, where, about=leading_comment(text), known_fmea=known_fmea)


def loads_phase(text: str, file: str, *, known_fmea: Iterable[str] | None = None) -> Phase:
    """A phase from text (tests, and phases read from a packaged folder)."""
    data, where = loads(text, file)
    return phase_from_data(data, where, about=leading_comment(text), known_fmea=known_fmea)


def phase_from_data(
    data: object, where: Where, *, about: str = "", known_fmea: Iterable[str] | None = None
) -> Phase:
    if not isinstance(data, dict):
        raise where.error(
            (), "a phase file must be a mapping (name, title, fmea, seed, run, expect)"
        )
    top = Fields(data, lambda key, reason: where.error((key,), reason))
    top.known(KEYS)
    for key in REQUIRED:
        if key not in data:
            raise where.error((), f"missing key {key!r}")
    if ("run" in data) == ("runs" in data):
        if "run" in data:
            raise where.error(("runs",), "give `run:` (one run) or `runs:` (several), not both")
        raise where.error((), "missing key 'run' (one scenario block) or 'runs' (several)")

    name = _name(data["name"], where)
    stem = Path(where.file).stem
    if stem != name and not re.fullmatch(rf"[0-9]+-{re.escape(name)}", stem):
        raise where.error(("name",), f"name {name!r} does not match the file name {stem!r}")
    title = _text(data["title"], where, ("title",))
    ids = _fmea(data["fmea"], where, known_fmea)
    seed = top.integer("seed", 0, maximum=MAX_SEED - 1)  # required: present
    mode = top.choice("mode", "in-process", MODES)
    budget = top.duration("budget", DEFAULT_BUDGET_S)
    if budget > MAX_BUDGET_S:
        top.fail("budget", f"must be at most {MAX_BUDGET_S:g}s, got {budget:g}s")
    runs = _runs(data, where)
    expect = _expect(data["expect"], where, runs, several="runs" in data)
    your_agent = _your_agent(data, where, runs, expect)
    walls = [getattr(r.scenario, "max_wall_clock", None) for r in runs]
    wall = sum(w for w in walls if isinstance(w, int | float))
    if wall > budget:
        what = "run.max_wall_clock" if len(runs) == 1 else "the runs' max_wall_clock together"
        raise where.error(
            ("budget",),
            f"budget {budget:g}s is shorter than {what} {wall:g}s: the phase "
            "would be cut off before the run's own hard stop",
        )
    return Phase(
        name=name,
        title=title,
        about=about,
        fmea=ids,
        seed=seed,
        mode=mode,
        budget_s=budget,
        expect=expect,
        runs=runs,
        source=where.file,
        line=where.line(()),
        lines={key: where.line((key,)) for key in data},
        your_agent=your_agent,
    )


def _your_agent(data: dict, where: Where, runs: tuple[RunSpec, ...], expect) -> object:
    """`your_agent:` (chaos.gameday.your_agent), and no boundary check that requires a
    check `about: agent` (skipped when the user's agent runs, it would leave it hanging)."""
    about = {e.assertion.name: e.about for e in expect}
    for i, e in enumerate(expect):
        if e.about != "agent" and any(about[r] == "agent" for r in e.requires):
            raise where.error(
                ("expect", i, "requires"), "a boundary check cannot require a check about: agent"
            )
    if "your_agent" not in data:
        return None
    return declaration_from_data(data["your_agent"], where, runs)


def _runs(data: dict, where: Where) -> tuple[RunSpec, ...]:
    if "run" in data:
        block = data["run"]
        if not isinstance(block, dict):
            raise where.error(("run",), "run must be a mapping: a scenario block (docs/chaos.md)")
        return (
            RunSpec(SINGLE_RUN, _scenario(block, where, ("run",)), block, "", where.line(("run",))),
        )
    items = data["runs"]
    if not isinstance(items, list) or len(items) < 2:
        raise where.error(
            ("runs",),
            "runs must be a list of two or more named runs ({name, run}); a phase with one "
            "run writes `run:`",
        )
    out: list[RunSpec] = []
    for i, item in enumerate(items):
        at = ("runs", i)
        if not isinstance(item, dict):
            raise where.error(at, "a run is a mapping: name, an optional title, and run")
        Fields(item, _located(where, at)).known(RUN_KEYS)
        for key in ("name", "run"):
            if key not in item:
                raise where.error(at, f"a run needs {key!r}")
        run_name = item["name"]
        if not isinstance(run_name, str) or not _NAME.fullmatch(run_name):
            raise where.error(
                (*at, "name"), "a run's name must be lowercase letters, digits and dashes"
            )
        if any(r.name == run_name for r in out):
            raise where.error((*at, "name"), f"run name {run_name!r} used twice in this phase")
        title = _text(item["title"], where, (*at, "title")) if "title" in item else ""
        block = item["run"]
        if not isinstance(block, dict):
            raise where.error(
                (*at, "run"), "run must be a mapping: a scenario block (docs/chaos.md)"
            )
        scenario = _scenario(block, where, (*at, "run"))
        out.append(RunSpec(run_name, scenario, block, title, where.line((*at, "name"))))
    return tuple(out)


def _located(where: Where, at: tuple) -> Callable[[str, str], Exception]:
    """A docket.fields reporter for the mapping at `at`: FILE:LINE: at PATH reason."""
    return lambda key, reason: where.error((*at, key), reason)


def _name(value: object, where: Where) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise where.error(("name",), "name must be lowercase letters, digits and dashes")
    return value


def _text(value: object, where: Where, path: tuple) -> str:
    if not isinstance(value, str) or not value.strip():
        raise where.error(path, "must be a non-empty string")
    return value.strip()


def _fmea(value: object, where: Where, known: Iterable[str] | None) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise where.error(("fmea",), "fmea must be a non-empty list of FMEA row ids, e.g. [F03]")
    known_ids = frozenset(known) if known is not None else fmea_ids()
    seen: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str) or not _FMEA_ID.fullmatch(item):
            raise where.error(("fmea", i), f"{item!r} is not an FMEA row id (F01, F02, ...)")
        if known_ids is not None and item not in known_ids:
            raise where.error(
                ("fmea", i), f"FMEA row {item} does not exist in docs/resilience.md's table"
            )
        if item in seen:
            raise where.error(("fmea", i), f"FMEA row {item} named twice")
        seen.append(item)
    return tuple(seen)


def _expect(
    value: object, where: Where, runs: tuple[RunSpec, ...], *, several: bool
) -> tuple[Expectation, ...]:
    if not isinstance(value, list) or not value:
        raise where.error(("expect",), "expect must be a non-empty list of assertions")
    out: list[Expectation] = []
    names: set[str] = set()
    for i, item in enumerate(value):
        at = ("expect", i)
        if not isinstance(item, dict):
            raise where.error(at, "an assertion is a mapping: name, query and one operator")
        for key in item:
            if key not in EXPECT_KEYS and key not in OPERATORS and key not in _MORE_EXPECT_KEYS:
                raise where.error(
                    (*at, key),
                    f"unknown key {key!r} (name, query, run, requires, about, and one of "
                    f"{', '.join(OPERATORS)})",
                )
        for key in EXPECT_KEYS:
            if key not in item:
                raise where.error(at, f"an assertion needs {key!r}")
        name = _text(item["name"], where, (*at, "name"))
        if name in names:
            raise where.error((*at, "name"), f"assertion name {name!r} used twice in this phase")
        names.add(name)
        ops = [key for key in item if key in OPERATORS]
        if len(ops) != 1:
            raise where.error(
                at,
                "an assertion needs exactly one operator "
                f"({', '.join(OPERATORS)}), found {len(ops) or 'none'}",
            )
        op = ops[0]
        query = item["query"]
        if not isinstance(query, str):
            raise where.error((*at, "query"), "query must be a JMESPath string")
        try:
            compiled = compile_query(query)
        except QueryError as exc:
            raise where.error((*at, "query"), str(exc)) from None
        problem = _operand_problem(op, item[op])
        if problem:
            raise where.error((*at, op), problem)
        run = _expect_run(item, where, at, runs, several)
        requires = _requires(item, where, at, out, run)
        out.append(
            Expectation(
                Assertion(name, query, op, item[op], compiled),
                where.line((*at, "name")),
                run,
                requires,
                _about(item, where, at),
            )
        )
    if several:
        for spec in runs:
            if not any(e.run == spec.name for e in out):
                raise where.error(("expect",), f"no assertion reads run {spec.name!r}")
    return tuple(out)


_MORE_EXPECT_KEYS = ("run", "requires", "about")


def _about(item: dict, where: Where, at: tuple) -> str:
    return about_from_data(item, where, at)


def _requires(
    item: dict, where: Where, at: tuple, earlier: list[Expectation], run: str
) -> tuple[str, ...]:
    """`requires: NAME` or a list of names: checks written before this one, on the same
    run (so there is no cycle, and the precondition reads the same evidence)."""
    if "requires" not in item:
        return ()
    value = item["requires"]
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise where.error((*at, "requires"), "requires names an earlier check, or a list of them")
    for name in names:
        found = next((e for e in earlier if e.assertion.name == name), None)
        if found is None:
            raise where.error(
                (*at, "requires"), f"requires {name!r}: no check of that name written before it"
            )
        if found.run != run:
            raise where.error(
                (*at, "requires"), f"requires {name!r}, which reads run {found.run!r}, not {run!r}"
            )
    if len(set(names)) != len(names):
        raise where.error((*at, "requires"), "requires names a check twice")
    return tuple(names)


def _expect_run(item: dict, where: Where, at: tuple, runs: tuple[RunSpec, ...], several: bool):
    """The run an assertion reads: named in a phase with several, implied in one with one."""
    if not several:
        if "run" in item:
            raise where.error((*at, "run"), "this phase has one run: an assertion names none")
        return SINGLE_RUN
    if "run" not in item:
        names = ", ".join(r.name for r in runs)
        raise where.error(at, f"an assertion in a phase with several runs names one ({names})")
    run = item["run"]
    if not any(r.name == run for r in runs):
        names = ", ".join(r.name for r in runs)
        raise where.error((*at, "run"), f"no run named {run!r} in this phase ({names})")
    return run


def _scenario(run_data: dict, where: Where, path: tuple):
    from chaos.scenario import scenario_from_data  # the engine (chaos/scenario.py)

    return scenario_from_data(run_data, where, path)


# ---------------------------------------------------------------- the folder


def _is_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or "/" in name or os.sep in name


def _phase_files(folder: Traversable) -> list[Traversable]:
    return sorted(
        (f for f in folder.iterdir() if f.name.endswith(".yaml") and f.is_file()),
        key=lambda f: f.name,
    )


def load_phases(selected: Sequence[str] = (), *, folder: Traversable | None = None) -> list[Phase]:
    """The phases to run, all checked before any runs.

    Every file in the folder is read (a broken phase file is a problem whichever
    phases are asked for); `selected` names phases by name, or by the path of a
    phase file elsewhere, and keeps the folder's order otherwise.
    """
    bundled = folder is None
    if folder is None:
        folder = data_folder("gamedays")
    known = fmea_ids()
    phases: list[Phase] = []
    for f in _phase_files(folder):
        text = f.read_text(encoding="utf-8")
        # The bundled phases are named by their place in the repository, wherever they
        # were read from (a checkout, or an installed wheel inside .nox/), so the report
        # and JUnit's file= point at the file a CI annotation should land on.
        shown = f"gamedays/{f.name}" if bundled else _shown_path(f)
        phases.append(loads_phase(text, shown, known_fmea=known))
    by_name: dict[str, Phase] = {}
    for phase in phases:
        if phase.name in by_name:
            raise InputError(
                f"{phase.source}:{phase.line}: phase name {phase.name!r} is also used by "
                f"{by_name[phase.name].source}"
            )
        by_name[phase.name] = phase
    if not selected:
        if not phases:
            raise InputError(f"no phase files (*.yaml) in {folder}")
        return phases
    chosen: list[Phase] = []
    for asked in selected:
        name, run = asked, None
        head, sep, tail = asked.rpartition(":")
        if sep and _NAME.fullmatch(tail) and not Path(asked).exists():
            name, run = head, tail  # NAME:RUN, one run of a phase with several
        if _is_path(name):
            phase = load_phase(name, known_fmea=known)
        elif name in by_name:
            phase = by_name[name]
        else:
            raise InputError(
                f"no phase named {name!r}; the phases are: {', '.join(by_name) or '(none)'}"
            )
        if run is not None:
            phase = phase.only(run)
        if any(p.name == phase.name for p in chosen):
            raise InputError(f"phase {phase.name!r} asked for twice")
        chosen.append(phase)
    return chosen


def _shown_path(f: Traversable) -> str:
    # A checkout's file is shown relative to the working directory when it can be.
    try:
        p = Path(str(f))
        return (
            os.path.relpath(p)
            if p.is_absolute() and not os.path.relpath(p).startswith("..")
            else str(p)
        )
    except ValueError:
        return str(f)


__all__ = [
    "DEFAULT_BUDGET_S",
    "MODES",
    "Expectation",
    "Phase",
    "RunSpec",
    "YamlError",
    "fmea_ids",
    "leading_comment",
    "load_phase",
    "load_phases",
    "loads_phase",
    "parse_duration",
    "phase_from_data",
]
