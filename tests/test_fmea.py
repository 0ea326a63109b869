"""The FMEA table in docs/resilience.md, held to the tree it describes.

The real table is read through chaos.gameday.fmea (the parser the game-day
report uses) and checked against the files: every detector path exists, every
`gameday:NAME` detector is a phase file in gamedays/, every phase names only
rows that exist, and phases and rows agree on who exercises what. The parser
itself is tested on small tables, valid and broken, each error naming its line.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from helpers import io_examples
from hypothesis import given, settings
from hypothesis import strategies as st

import chaos.gameday.fmea
from chaos.gameday.fmea import FmeaError, FmeaRow, fmea_rows, load_fmea, rows_as_data
from chaos.yamldoc import YamlError, load
from docket.cli_help import GAMEDAY_PHASES
from docket.errors import EXIT_USAGE, InputError

ROOT = Path(__file__).resolve().parent.parent
RESILIENCE = ROOT / "docs" / "resilience.md"
GAMEDAYS = ROOT / "gamedays"

ROW_IDS = {f"F{n:02d}" for n in range(1, 24)}  # fixed: phase files and the report name them
PHASES = set(GAMEDAY_PHASES)


@pytest.fixture(scope="module")
def rows() -> list[FmeaRow]:
    return load_fmea(RESILIENCE.read_text(encoding="utf-8"))


def read_phases(folder: Path = GAMEDAYS) -> tuple[dict[str, tuple[Path, list]], list[str]]:
    """{phase name: (file, fmea ids)} for folder/*.yaml, and the problems found reading them."""
    phases: dict[str, tuple[Path, list]] = {}
    problems: list[str] = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            doc, where = load(path)
        except YamlError as exc:
            problems.append(str(exc))
            continue
        if not isinstance(doc, dict):
            problems.append(f"{path}:1: a phase file is a mapping")
            continue
        name, ids = doc.get("name"), doc.get("fmea")
        if not isinstance(name, str) or path.stem not in (name, *named_files(folder, name)):
            problems.append(
                f"{path}:{where.line(['name'])}: name {name!r} is not the file's NAME or NN-NAME"
            )
            continue
        if not isinstance(ids, list) or not ids:
            problems.append(f"{path}:{where.line(['fmea'])}: fmea is not a non-empty list of ids")
            continue
        phases[name] = (path, ids)
    return phases, problems


def unknown_rows(rows: list[FmeaRow], phases: dict[str, tuple[Path, list]]) -> list[str]:
    """Each `fmea:` entry of a phase that names no row of the table."""
    known = {r.id for r in rows}
    return [f"{path.name}: {i!r}" for path, ids in phases.values() for i in ids if i not in known]


def named_files(folder: Path, name: str) -> list[str]:
    """Stems of the phase files for `name`: NAME.yaml or NN-NAME.yaml (NN digits)."""
    return [
        f.stem
        for f in folder.glob("*.yaml")
        if re.fullmatch(rf"(?:[0-9]+-)?{re.escape(name)}", f.stem)
    ]


def unmatched_detectors(rows: list[FmeaRow], folder: Path = GAMEDAYS) -> list[str]:
    """Each `gameday:NAME` detector with no phase file for NAME in folder."""
    return [f"{r.id}: gameday:{p}" for r in rows for p in r.phases if not named_files(folder, p)]


def disagreements(rows: list[FmeaRow], phases: dict[str, tuple[Path, list]]) -> list[str]:
    """(row, phase) links one side states and the other does not."""
    from_rows = {(r.id, p) for r in rows for p in r.phases}
    from_phases = {(i, name) for name, (_, ids) in phases.items() for i in ids}
    return sorted(
        [f"{p} lists {i}, but {i} does not name gameday:{p}" for i, p in from_phases - from_rows]
        + [f"{i} names gameday:{p}, but {p} does not list {i}" for i, p in from_rows - from_phases]
    )


# ------------------------------------------------------------------ the real table


def test_the_table_has_exactly_the_fixed_rows(rows):
    assert [r.id for r in rows] and {r.id for r in rows} == ROW_IDS
    assert len(rows) == len(ROW_IDS)


def test_the_packaged_page_is_the_page_in_the_tree(rows):
    # load_fmea() with no text is what the report calls; in a checkout it reads this file.
    assert load_fmea() == rows


def test_rows_are_ranked_by_rpn_and_each_rpn_is_its_product(rows):
    assert [r.rpn for r in rows] == sorted((r.rpn for r in rows), reverse=True)
    for r in rows:
        assert r.rpn == r.severity * r.occurrence * r.detection, r.id
        assert all(1 <= v <= 5 for v in (r.severity, r.occurrence, r.detection)), r.id


def test_every_row_links_by_its_own_anchor(rows):
    text = RESILIENCE.read_text(encoding="utf-8")
    for r in rows:
        assert r.anchor == r.id.lower()
        assert text.count(f'<a id="{r.anchor}"></a>') == 1, r.id


def test_every_row_has_a_detector_and_every_named_path_exists(rows):
    missing = [f"{r.id}: {path}" for r in rows for path in r.paths if not (ROOT / path).exists()]
    assert all(r.detectors for r in rows)
    assert missing == []


def test_every_row_names_a_test_that_runs_in_the_suite(rows):
    # A detector nobody runs is a claim; each row must name at least one test file.
    untested = [
        r.id for r in rows if not any(re.fullmatch(r"tests/test_\w+\.py", p) for p in r.paths)
    ]
    assert untested == []


def test_every_phase_a_row_names_is_one_of_the_nine(rows):
    named = {phase for r in rows for phase in r.phases}
    assert named <= PHASES, named - PHASES
    assert named == PHASES  # each phase exercises some row


# ---------------------------------------------------- the phase files (gamedays/*.yaml)
# H2's phase files arrive in parallel: until all nine exist these fail, by design.


def test_there_are_exactly_the_nine_phase_files():
    phases, problems = read_phases()
    assert problems == []
    assert set(phases) == PHASES, f"gamedays/ has {sorted(phases)}"


def test_every_gameday_detector_names_a_phase_file(rows):
    assert unmatched_detectors(rows) == []


def test_every_phase_names_only_rows_that_exist(rows):
    phases, problems = read_phases()
    assert phases, "no phase files in gamedays/"
    assert problems == []
    assert unknown_rows(rows, phases) == []


def test_phases_and_rows_agree_on_who_exercises_what(rows):
    # The report links rows to phases from both sides; they must tell the same story.
    phases, _ = read_phases()
    assert phases, "no phase files in gamedays/"
    assert disagreements(rows, phases) == []


def test_the_phase_checks_catch_what_they_are_for(tmp_path, rows):
    # The same checks on a folder of broken phase files, so they are known to bite
    # whatever gamedays/ holds today.
    (tmp_path / "01-upstream-failure.yaml").write_text("name: upstream-failure\nfmea: [F01, F99]\n")
    (tmp_path / "02-partition.yaml").write_text("name: circuit-breaker\nfmea: [F03]\n")
    (tmp_path / "03-retry-storm.yaml").write_text("name: retry-storm\nfmea: []\n")
    (tmp_path / "04-evidence-loss.yaml").write_text("- not a mapping\n")
    phases, problems = read_phases(tmp_path)
    assert list(phases) == ["upstream-failure"]
    assert [p.split(": ", 1)[0].rsplit("/", 1)[1] for p in problems] == [
        "02-partition.yaml:1",
        "03-retry-storm.yaml:2",
        "04-evidence-loss.yaml:1",
    ]
    assert unknown_rows(rows, phases) == ["01-upstream-failure.yaml: 'F99'"]
    assert "F01 names gameday:retry-storm, but retry-storm does not list F01" in disagreements(
        rows, phases
    )
    assert "upstream-failure lists F99, but F99 does not name gameday:upstream-failure" in (
        disagreements(rows, phases)
    )
    missing = unmatched_detectors(rows, tmp_path)
    assert "F03: gameday:circuit-breaker" in missing and "F06: gameday:runaway-loop" in missing
    assert not any(m.endswith(("gameday:upstream-failure", "gameday:partition")) for m in missing)


def test_phase_files_that_agree_with_the_table_pass_every_check(tmp_path, rows):
    for n, phase in enumerate(sorted(PHASES), 1):
        ids = ", ".join(r.id for r in rows if phase in r.phases)
        (tmp_path / f"{n:02d}-{phase}.yaml").write_text(f"name: {phase}\nfmea: [{ids}]\n")
    phases, problems = read_phases(tmp_path)
    assert problems == [] and set(phases) == PHASES
    assert unknown_rows(rows, phases) == []
    assert unmatched_detectors(rows, tmp_path) == []
    assert disagreements(rows, phases) == []


# ------------------------------------------------------------------ the parser

HEADER = "| id | failure mode | effect | S | O | D | RPN | detectors | mitigation |"
RULE = "|---|---|---|---|---|---|---|---|---|"
PREAMBLE = "# Page\n\nSome words.\n\n| what | where |\n|---|---|\n| a | b |\n\n"
FIRST_ROW_LINE = PREAMBLE.count("\n") + 3  # header, rule, then the rows


def row(
    rid: str = "F01",
    s: object = 3,
    o: object = 2,
    d: object = 1,
    rpn: object = None,
    detectors: str = "`tests/test_x.py` `gameday:upstream-failure`",
    anchor: str | None = None,
) -> str:
    rpn = s * o * d if rpn is None else rpn  # type: ignore[operator]
    anchor = rid.lower() if anchor is None else anchor
    return (
        f'| <a id="{anchor}"></a>{rid} | mode {rid} | effect {rid} | {s} | {o} | {d} | {rpn} |'
        f" {detectors} | mitigation {rid} |"
    )


def page(*rows_: str, header: str = HEADER, rule: str = RULE) -> str:
    return PREAMBLE + "\n".join([header, rule, *rows_]) + "\n\nAfter the table.\n"


def error_of(text: str) -> FmeaError:
    with pytest.raises(FmeaError) as caught:
        load_fmea(text, source="t.md")
    return caught.value


def test_a_small_table_reads_into_rows():
    got = load_fmea(page(row("F02", 5, 4, 2), row("F01", 1, 1, 1, detectors="`docket/x.py`")))
    assert got == [
        FmeaRow(
            id="F02",
            mode="mode F02",
            effect="effect F02",
            severity=5,
            occurrence=4,
            detection=2,
            rpn=40,
            detectors=("tests/test_x.py", "gameday:upstream-failure"),
            mitigation="mitigation F02",
            anchor="f02",
        ),
        FmeaRow(
            "F01", "mode F01", "effect F01", 1, 1, 1, 1, ("docket/x.py",), "mitigation F01", "f01"
        ),
    ]
    assert got[0].phases == ("upstream-failure",) and got[0].paths == ("tests/test_x.py",)


def test_columns_may_come_in_any_order_with_extra_ones():
    header = "| ID | RPN | Failure  Mode | effect | notes | S | O | D | Detectors | mitigation |"
    line = '| <a id="f01"></a>F01 | 6 | m | e | n | 3 | 2 | 1 | `a/b.py` | x |'
    (got,) = load_fmea(page(line, header=header, rule="|-|-|-|-|-|-|-|-|-|-|".replace("-", "---")))
    assert (got.id, got.mode, got.rpn, got.detectors) == ("F01", "m", 6, ("a/b.py",))


def test_an_escaped_pipe_stays_inside_its_cell():
    line = row("F01").replace("mode F01", r"a \| b")
    assert load_fmea(page(line))[0].mode == "a | b"


@pytest.mark.parametrize(
    "header, says",
    [
        (HEADER.replace("| RPN ", ""), "no RPN column"),
        (HEADER.replace("| detectors ", ""), "no detectors column"),
        (HEADER.replace("| S | O |", "| O |"), "no S column"),
        (HEADER.replace("effect", "mitigation"), "column 'mitigation' repeated"),
    ],
)
def test_a_missing_or_repeated_column_names_the_header_line(header, says):
    width = len(header.strip("|").split("|"))
    err = error_of(page(row(), header=header, rule="|" + "---|" * width))
    assert err.line == FIRST_ROW_LINE - 2
    assert str(err).startswith(f"t.md:{FIRST_ROW_LINE - 2}: ") and says in str(err)


@pytest.mark.parametrize(
    "rows_, line, says",
    [
        ([row(s=0, rpn=0)], 0, "S '0' is not a whole number 1-5"),
        ([row(o=6, rpn=6)], 0, "O '6' is not a whole number 1-5"),
        ([row(d="x", rpn=6)], 0, "D 'x' is not a whole number 1-5"),
        ([row(d="2.0", rpn=12)], 0, "D '2.0' is not a whole number 1-5"),
        ([row(rpn=7)], 0, "RPN 7 is not S x O x D = 3x2x1 = 6"),
        ([row(rpn="six")], 0, "RPN 'six' is not a whole number"),
        ([row("F01"), row("F02", 1), row("F01", 1)], 2, "F01 repeated (first on line"),
        ([row("F01", 1), row("F02", 5)], 1, "F02 (RPN 10) comes after F01 (RPN 2)"),
        ([row(detectors="none yet")], 0, "F01: no detector"),
        ([row(detectors="")], 0, "F01: no detector"),
        ([row(detectors="`../outside.py`")], 0, "neither a relative path nor gameday:NAME"),
        ([row(detectors="`/etc/passwd`")], 0, "neither a relative path nor gameday:NAME"),
        ([row(detectors="`gameday:Two Words`")], 0, "does not name a phase"),
        ([row(detectors="`a.py` `a.py`")], 0, "a detector is named twice"),
        ([row(anchor="f1")], 0, "anchor 'f1' is not 'f01'"),
        ([row().replace('<a id="f01"></a>', "")], 0, "is not <a id="),
        ([row("X1", anchor="x1")], 0, "row id 'X1' is not F and two digits"),
        ([row().replace("| mode F01 ", "")], 0, "8 cells where the header has 9 columns"),
        ([row().replace("effect F01", "")], 0, "F01: the effect cell is empty"),
    ],
)
def test_a_malformed_row_names_its_line_and_reason(rows_, line, says):
    err = error_of(page(*rows_))
    assert err.line == FIRST_ROW_LINE + line, str(err)
    assert str(err).startswith(f"t.md:{FIRST_ROW_LINE + line}: ")
    assert says in str(err)


def test_the_table_must_have_its_rule_and_rows():
    assert error_of(page(row(), rule="| not a rule |")).line == FIRST_ROW_LINE - 1
    err = error_of(page())
    assert err.line == FIRST_ROW_LINE - 2 and "no rows" in str(err)


def test_a_page_without_one_fmea_table_is_refused():
    err = error_of("# Page\n\n| what | where |\n|---|---|\n| a | b |\n")
    assert err.line == 1 and "no FMEA table" in str(err)
    twice = page(row()) + "\n" + "\n".join([HEADER, RULE, row()]) + "\n"
    headers = [n for n, line in enumerate(twice.splitlines(), 1) if line == HEADER]
    err = error_of(twice)
    assert len(headers) == 2 and err.line == headers[1]
    assert f"a second FMEA table (the first is on line {headers[0]})" in str(err)


def test_an_fmea_error_is_an_input_error_of_one_line():
    err = error_of(page(row(rpn=7)))
    assert isinstance(err, InputError) and err.exit_code == EXIT_USAGE
    assert "\n" not in str(err)


SOD = st.tuples(*(st.integers(1, 5),) * 3)


@settings(max_examples=io_examples(), deadline=None)
@given(st.lists(SOD, min_size=1, max_size=12), st.data())
def test_any_ranked_table_round_trips_and_any_misranked_one_is_refused_where_it_breaks(sods, data):
    ids = [f"F{n:02d}" for n in range(1, len(sods) + 1)]
    ranked = sorted(
        zip(ids, sods, strict=True), key=lambda item: -item[1][0] * item[1][1] * item[1][2]
    )
    got = load_fmea(page(*(row(i, *sod) for i, sod in ranked)))
    assert [(r.id, r.severity, r.occurrence, r.detection) for r in got] == [
        (i, *sod) for i, sod in ranked
    ]
    assert [r.rpn for r in got] == sorted((r.rpn for r in got), reverse=True)

    order = data.draw(st.permutations(ranked))
    rpns = [s * o * d for _, (s, o, d) in order]
    breaks = [k for k in range(1, len(rpns)) if rpns[k] > rpns[k - 1]]
    text = page(*(row(i, *sod) for i, sod in order))
    if not breaks:
        assert [r.id for r in load_fmea(text)] == [i for i, _ in order]
    else:
        err = error_of(text)
        assert err.line == FIRST_ROW_LINE + breaks[0]
        assert f"{order[breaks[0]][0]} (RPN {rpns[breaks[0]]}) comes after" in str(err)


def test_reading_the_page_itself_fails_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(chaos.gameday.fmea, "folder", lambda name: tmp_path)
    with pytest.raises(FmeaError, match=r"^docs/resilience\.md:1: no such file$"):
        load_fmea()
    (tmp_path / "resilience.md").write_bytes(b"| id |\n\xff\n")
    with pytest.raises(FmeaError, match=r"^docs/resilience\.md:1: not UTF-8 text \(byte 7\)$"):
        load_fmea()
    (tmp_path / "resilience.md").write_text(page(row()), encoding="utf-8")
    assert [r.id for r in load_fmea()] == ["F01"]


# ---------------------------------------------------------------- the data the game day reads


def test_the_data_file_is_the_table_in_the_page(rows):
    """docs/fmea.json is what `python -m chaos.gameday.fmea` writes from the page: an
    edit to one without the other fails here, in the suite, not in a user's game day."""
    data = (ROOT / "docs" / "fmea.json").read_text(encoding="utf-8")
    assert data == rows_as_data(rows), "run `python -m chaos.gameday.fmea`"
    assert fmea_rows(data) == rows


def test_a_broken_table_on_the_page_does_not_break_the_game_day(tmp_path, monkeypatch):
    from chaos.gameday.phase import fmea_ids

    (tmp_path / "fmea.json").write_bytes((ROOT / "docs" / "fmea.json").read_bytes())
    (tmp_path / "resilience.md").write_text("| id | effect |\n| nothing |\n", encoding="utf-8")
    monkeypatch.setattr(chaos.gameday.fmea, "folder", lambda name: tmp_path)
    with pytest.raises(FmeaError):
        load_fmea()  # the page no longer parses...
    assert fmea_ids() == ROW_IDS  # ...and the game day reads its rows all the same


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "no such file"),
        (b"", "empty"),
        (b"\xff", "not UTF-8 text (byte 0)"),
        (b"[\x00]", "binary data"),
        (b" " * ((1 << 20) + 1), "more than"),
        ("fifo", "not a regular file"),
        ("dir", "is a directory"),
        (b"{}", "not the FMEA rows"),
        (b"[]", "not the FMEA rows"),
        (b'[{"id": "F01"}]', "not the FMEA rows (KeyError"),
        (b'[{"id": "F01", "detectors": []}]', "not the FMEA rows (TypeError"),
        (b"[1, 2]", "not the FMEA rows"),
        (b"[", "not the FMEA rows (JSONDecodeError"),
        (b"[" * 5000 + b"]" * 5000, "not the FMEA rows"),
    ],
)
def test_a_missing_or_broken_data_file_is_one_line_naming_it(tmp_path, monkeypatch, content, says):
    """What an agent of the same user could leave at docs/fmea.json: one line naming the
    file, never a hang (a FIFO is refused unopened) nor a traceback."""
    data = tmp_path / "fmea.json"
    if content == "fifo":
        os.mkfifo(data)
    elif content == "dir":
        data.mkdir()
    elif content is not None:
        data.write_bytes(content)
    monkeypatch.setattr(chaos.gameday.fmea, "folder", lambda name: tmp_path)
    with pytest.raises(FmeaError) as caught:
        fmea_rows()
    assert str(caught.value).startswith("docs/fmea.json:1: ")
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)
