"""Phase files: what one game-day phase runs and what it asserts, checked before anything starts.

A phase is a YAML file in gamedays/ (docs/gamedays.md has the schema). Every
key is checked here, and every mistake is one line, `FILE:LINE: at a.b[2] reason`,
raised as an InputError (exit 2) before any phase runs: an unknown key, a wrong
type, a bad duration, a query JMESPath cannot compile, an FMEA row the table
does not have, or a `run:` block the chaos engine refuses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path

from chaos.gameday.assertions import OPERATORS, Assertion, QueryError, compile_query
from chaos.gameday.assertions import operand_problem as _operand_problem
from chaos.yamldoc import Where, YamlError, load, loads
from docket.errors import InputError

MODES = ("in-process", "subprocess")
KEYS = ("name", "title", "fmea", "seed", "run", "mode", "budget", "expect")
REQUIRED = ("name", "title", "fmea", "seed", "run", "expect")
EXPECT_KEYS = ("name", "query")
DEFAULT_BUDGET_S = 30.0
MAX_BUDGET_S = 600.0
MAX_SEED = 1 << 53  # the receipt keeps the seed as an exact JSON integer (chaos.scenario)

_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_FMEA_ID = re.compile(r"F[0-9]{2}")
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0}


@dataclass(frozen=True)
class Expectation:
    """An assertion and the line of the phase file it was written on."""

    assertion: Assertion
    line: int


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
    run: object  # chaos.scenario.Scenario
    run_data: Mapping  # the `run:` block as written (subprocess mode hands it to `docket chaos`)
    source: str
    line: int = 1
    lines: Mapping[str, int] = field(default_factory=dict)  # top-level key -> line

    @property
    def assertions(self) -> tuple[Assertion, ...]:
        return tuple(e.assertion for e in self.expect)

    def repro(self, seed: int | None = None) -> str:
        """The command that runs this phase again with the same seed."""
        return f"docket game-day --phase {self.name} --seed {self.seed if seed is None else seed}"


# ---------------------------------------------------------------- values


def parse_duration(value: object) -> float | None:
    """Seconds from `20s`, `500ms`, `1.5m` or a bare number of seconds; None if not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        m = _DURATION.fullmatch(value.strip())
        if m:
            return float(m.group(1)) * _UNIT_S[m.group(2)]
    return None


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
    """The FMEA table's row ids (docs/resilience.md via chaos.gameday.fmea)."""
    try:
        from chaos.gameday.fmea import load_fmea
    except ImportError:  # chaos.gameday.fmea not written yet: ids are then only checked for shape
        return None
    return frozenset(row.id for row in load_fmea())


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
    for key in data:
        if key not in KEYS:
            raise where.error((key,), f"unknown key {key!r} (one of {', '.join(KEYS)})")
    for key in REQUIRED:
        if key not in data:
            raise where.error((), f"missing key {key!r}")

    name = _name(data["name"], where)
    stem = Path(where.file).stem
    if stem != name and not re.fullmatch(rf"[0-9]+-{re.escape(name)}", stem):
        raise where.error(("name",), f"name {name!r} does not match the file name {stem!r}")
    title = _text(data["title"], where, ("title",))
    ids = _fmea(data["fmea"], where, known_fmea)
    seed = data["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        raise where.error(("seed",), "seed must be a whole number from 0 to 2**53 - 1")
    mode = data.get("mode", "in-process")
    if mode not in MODES:
        raise where.error(("mode",), f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    budget = _budget(data.get("budget", DEFAULT_BUDGET_S), where)
    expect = _expect(data["expect"], where)
    run_data = data["run"]
    if not isinstance(run_data, dict):
        raise where.error(("run",), "run must be a mapping: a scenario block (docs/chaos.md)")
    scenario = _scenario(run_data, where)
    wall = getattr(scenario, "max_wall_clock", None)
    if isinstance(wall, int | float) and wall > budget:
        raise where.error(
            ("budget",),
            f"budget {budget:g}s is shorter than run.max_wall_clock {wall:g}s: the phase "
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
        run=scenario,
        run_data=run_data,
        source=where.file,
        line=where.line(()),
        lines={key: where.line((key,)) for key in data},
    )


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


def _budget(value: object, where: Where) -> float:
    seconds = parse_duration(value)
    if seconds is None:
        raise where.error(
            ("budget",), f"budget must be a duration like 20s or 500ms, not {value!r}"
        )
    if not 0 < seconds <= MAX_BUDGET_S:
        raise where.error(("budget",), f"budget must be more than 0 and at most {MAX_BUDGET_S:g}s")
    return seconds


def _expect(value: object, where: Where) -> tuple[Expectation, ...]:
    if not isinstance(value, list) or not value:
        raise where.error(("expect",), "expect must be a non-empty list of assertions")
    out: list[Expectation] = []
    names: set[str] = set()
    for i, item in enumerate(value):
        at = ("expect", i)
        if not isinstance(item, dict):
            raise where.error(at, "an assertion is a mapping: name, query and one operator")
        for key in item:
            if key not in EXPECT_KEYS and key not in OPERATORS:
                raise where.error(
                    (*at, key),
                    f"unknown key {key!r} (name, query, and one of {', '.join(OPERATORS)})",
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
        out.append(
            Expectation(Assertion(name, query, op, item[op], compiled), where.line((*at, "name")))
        )
    return tuple(out)


def _scenario(run_data: dict, where: Where):
    from chaos.scenario import scenario_from_data  # the engine (chaos/scenario.py)

    return scenario_from_data(run_data, where, ("run",))


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
    if folder is None:
        from chaos.data.locate import folder as data_folder

        folder = data_folder("gamedays")
    known = fmea_ids()
    phases: list[Phase] = []
    for f in _phase_files(folder):
        text = f.read_text(encoding="utf-8")
        phases.append(loads_phase(text, _shown_path(f), known_fmea=known))
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
    for name in selected:
        if _is_path(name):
            phase = load_phase(name, known_fmea=known)
        elif name in by_name:
            phase = by_name[name]
        else:
            raise InputError(
                f"no phase named {name!r}; the phases are: {', '.join(by_name) or '(none)'}"
            )
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
    "YamlError",
    "fmea_ids",
    "leading_comment",
    "load_phase",
    "load_phases",
    "loads_phase",
    "parse_duration",
    "phase_from_data",
]
