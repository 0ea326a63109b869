"""The project's FMEA: the ranked table in docs/resilience.md, and the data the game
day reads (docs/fmea.json).

The table is written for people (a markdown table on a documentation page); the
game day (the report's links, the phases' `fmea:` ids) reads docs/fmea.json, the
same rows as data, so an edit to the page can never break `docket game-day`.
`python -m chaos.gameday.fmea` writes the data from the page; tests/test_fmea.py
fails when the two differ, and checks that every detector the rows name exists.
The page's parser is strict about its shape: a table that does not parse is
refused with the line and the reason, never read half-way.

The FMEA table is the markdown table whose header row begins with an `id`
column. It must have (in any order, other columns allowed) the columns:

    id | failure mode | effect | S | O | D | RPN | detectors | mitigation

- id: `<a id="f03"></a>F03`: the row's id (F and two digits, unique) after an
  HTML anchor whose id is the row id in lower case, so `resilience.md#f03`
  links to the row on GitHub and in the report.
- S, O, D: severity, occurrence and detection, each a whole number 1-5
  (detection 5 = hardest to detect); RPN: their product, stated, and checked.
- detectors: one or more backticked items, each a path in the tree
  (`docket/guards/breaker.py`, `tests/test_breaker.py`) or `gameday:<phase>`.
  At least one: a failure mode nothing detects is not analysed, only listed.
- rows ranked by RPN, highest first (ties in any order).

Pure: text in, rows out. Whether a named path or phase exists is the tree's
business (tests/test_fmea.py), not the parser's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from chaos.data.locate import as_file, folder
from docket.errors import InputError
from docket.inputs import read_text

SOURCE = "docs/resilience.md"
DATA = "docs/fmea.json"
MAX_DATA_BYTES = 1 << 20  # 23 rows are ~12 KB

COLUMNS = ("id", "failure mode", "effect", "s", "o", "d", "rpn", "detectors", "mitigation")
GAMEDAY = "gameday:"

_ID_CELL = re.compile(r'<a\s+id="(?P<anchor>[^"]*)"\s*>\s*</a>\s*(?P<id>\S+)')
_ROW_ID = re.compile(r"F\d{2}")
_PHASE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_PATH = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/?")
_WHOLE = re.compile(r"[0-9]+")
_CODE_SPAN = re.compile(r"`([^`]*)`")
_SEPARATOR_CELL = re.compile(r":?-{3,}:?")
_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


class FmeaError(InputError):
    """The FMEA table is missing or malformed: `SOURCE:LINE: reason`."""

    def __init__(self, source: str, line: int, reason: str):
        super().__init__(f"{source}:{line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class FmeaRow:
    """One failure mode, as the table states it (text cells are the raw markdown)."""

    id: str
    mode: str
    effect: str
    severity: int
    occurrence: int
    detection: int
    rpn: int
    detectors: tuple[str, ...]
    mitigation: str
    anchor: str

    @property
    def phases(self) -> tuple[str, ...]:
        """The game-day phases named among the detectors (`gameday:<name>`), by name."""
        return tuple(d[len(GAMEDAY) :] for d in self.detectors if d.startswith(GAMEDAY))

    @property
    def paths(self) -> tuple[str, ...]:
        """The detectors that are paths in the tree."""
        return tuple(d for d in self.detectors if not d.startswith(GAMEDAY))


def load_fmea(text: str | None = None, *, source: str = SOURCE) -> list[FmeaRow]:
    """The FMEA rows, in the table's (ranked) order; None reads docs/resilience.md."""
    if text is None:
        text = _read_packaged(source)
    lines = text.splitlines()
    start = _find_table(lines, source)
    header_no = start + 1
    columns = _header(lines[start], header_no, source)
    if start + 1 >= len(lines) or not _is_separator(lines[start + 1], len(columns)):
        raise FmeaError(source, header_no + 1, "the header row must be followed by |---|---| ...")
    rows: list[FmeaRow] = []
    seen: dict[str, int] = {}
    for index in range(start + 2, len(lines)):
        raw = lines[index]
        if not raw.lstrip().startswith("|"):
            break
        line_no = index + 1
        row = _row(_cells(raw), columns, line_no, source)
        if row.id in seen:
            raise FmeaError(source, line_no, f"{row.id} repeated (first on line {seen[row.id]})")
        if rows and row.rpn > rows[-1].rpn:
            raise FmeaError(
                source,
                line_no,
                f"{row.id} (RPN {row.rpn}) comes after {rows[-1].id} (RPN {rows[-1].rpn}):"
                " rows go highest RPN first",
            )
        seen[row.id] = line_no
        rows.append(row)
    if not rows:
        raise FmeaError(source, header_no, "the FMEA table has no rows")
    return rows


def _read_packaged(source: str) -> str:
    page = folder("docs") / "resilience.md"
    try:
        return page.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FmeaError(source, 1, "no such file") from None
    except UnicodeDecodeError as exc:
        raise FmeaError(source, 1, f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise FmeaError(source, 1, f"cannot read ({exc.strerror or exc})") from None


def _cells(line: str) -> list[str]:
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    if body.endswith("|") and not body.endswith("\\|"):
        body = body[:-1]
    return [cell.strip().replace("\\|", "|") for cell in _UNESCAPED_PIPE.split(body)]


def _normal(name: str) -> str:
    return " ".join(name.lower().split())


def _find_table(lines: list[str], source: str) -> int:
    """The index of the FMEA table's header row (the one table that begins with `id`)."""
    found = [
        i
        for i, line in enumerate(lines)
        if line.lstrip().startswith("|")
        and (i == 0 or not lines[i - 1].lstrip().startswith("|"))
        and _normal(_cells(line)[0]) == "id"
    ]
    if not found:
        raise FmeaError(source, 1, "no FMEA table (a markdown table whose header begins with id)")
    if len(found) > 1:
        raise FmeaError(
            source, found[1] + 1, f"a second FMEA table (the first is on line {found[0] + 1})"
        )
    return found[0]


def _header(line: str, line_no: int, source: str) -> dict[str, int]:
    names = [_normal(c) for c in _cells(line)]
    columns: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in columns:
            raise FmeaError(source, line_no, f"column {name!r} repeated")
        columns[name] = i
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        shown = ", ".join(_shown(c) for c in missing)
        raise FmeaError(source, line_no, f"the FMEA table has no {shown} column")
    return columns


def _shown(column: str) -> str:
    return column.upper() if len(column) <= 3 and column != "id" else column


def _is_separator(line: str, width: int) -> bool:
    cells = _cells(line)
    return len(cells) == width and all(_SEPARATOR_CELL.fullmatch(c) for c in cells)


def _row(cells: list[str], columns: dict[str, int], line_no: int, source: str) -> FmeaRow:
    if len(cells) != len(columns):
        raise FmeaError(
            source, line_no, f"{len(cells)} cells where the header has {len(columns)} columns"
        )

    def cell(name: str) -> str:
        return cells[columns[name]]

    row_id, anchor = _id_cell(cell("id"), line_no, source)
    texts = {}
    for name in ("failure mode", "effect", "mitigation"):
        texts[name] = cell(name)
        if not texts[name]:
            raise FmeaError(source, line_no, f"{row_id}: the {name} cell is empty")
    s, o, d = (_rank(cell(name), name, row_id, line_no, source) for name in ("s", "o", "d"))
    rpn_text = cell("rpn")
    if not _WHOLE.fullmatch(rpn_text):
        raise FmeaError(source, line_no, f"{row_id}: RPN {rpn_text!r} is not a whole number")
    rpn = int(rpn_text)
    if rpn != s * o * d:
        raise FmeaError(
            source, line_no, f"{row_id}: RPN {rpn} is not S x O x D = {s}x{o}x{d} = {s * o * d}"
        )
    return FmeaRow(
        id=row_id,
        mode=texts["failure mode"],
        effect=texts["effect"],
        severity=s,
        occurrence=o,
        detection=d,
        rpn=rpn,
        detectors=_detectors(cell("detectors"), row_id, line_no, source),
        mitigation=texts["mitigation"],
        anchor=anchor,
    )


def _id_cell(text: str, line_no: int, source: str) -> tuple[str, str]:
    match = _ID_CELL.fullmatch(text)
    if match is None:
        raise FmeaError(
            source, line_no, f'id cell {text!r} is not <a id="fNN"></a>FNN (an anchor, then the id)'
        )
    row_id, anchor = match["id"], match["anchor"]
    if not _ROW_ID.fullmatch(row_id):
        raise FmeaError(source, line_no, f"row id {row_id!r} is not F and two digits")
    if anchor != row_id.lower():
        raise FmeaError(source, line_no, f"{row_id}: anchor {anchor!r} is not {row_id.lower()!r}")
    return row_id, anchor


def _rank(text: str, name: str, row_id: str, line_no: int, source: str) -> int:
    if text not in {"1", "2", "3", "4", "5"}:
        raise FmeaError(
            source, line_no, f"{row_id}: {name.upper()} {text!r} is not a whole number 1-5"
        )
    return int(text)


def _detectors(text: str, row_id: str, line_no: int, source: str) -> tuple[str, ...]:
    found = tuple(span.strip() for span in _CODE_SPAN.findall(text))
    if not found:
        raise FmeaError(source, line_no, f"{row_id}: no detector (name each one in backticks)")
    for detector in found:
        if detector.startswith(GAMEDAY):
            if not _PHASE.fullmatch(detector[len(GAMEDAY) :]):
                raise FmeaError(
                    source, line_no, f"{row_id}: {detector!r} does not name a phase (gameday:NAME)"
                )
        elif ".." in detector.split("/") or not _PATH.fullmatch(detector):
            raise FmeaError(
                source,
                line_no,
                f"{row_id}: detector {detector!r} is neither a relative path nor gameday:NAME",
            )
    if len(set(found)) != len(found):
        raise FmeaError(source, line_no, f"{row_id}: a detector is named twice")
    return found


__all__ = ["COLUMNS", "FmeaError", "FmeaRow", "load_fmea"]


# ---------------------------------------------------------------- the data the game day reads


def rows_as_data(rows: list[FmeaRow]) -> str:
    """The rows as docs/fmea.json holds them (stable: sorted keys, one row a line)."""
    lines = [json.dumps(dataclasses.asdict(row), sort_keys=True) for row in rows]
    return "[\n" + ",\n".join(lines) + "\n]\n"


def fmea_rows(text: str | None = None) -> list[FmeaRow]:
    """The FMEA rows the game day uses, from docs/fmea.json (or `text`, its content).
    FmeaError (one line) when the file is missing or not rows."""
    if text is None:
        text = _read_data()
    try:
        data = json.loads(text)
        rows = [
            FmeaRow(**{**item, "detectors": tuple(item["detectors"])})
            for item in data
            if isinstance(item, dict)
        ]
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        raise FmeaError(DATA, 1, f"not the FMEA rows ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, list) or len(rows) != len(data) or not rows:
        raise FmeaError(DATA, 1, "not the FMEA rows (a non-empty JSON list of rows)")
    return rows


def _read_data() -> str:
    # docket.inputs.read_text: a regular file (not a FIFO an agent left in its place, not
    # a directory), at most MAX_DATA_BYTES, UTF-8 without NUL; else one line, named.
    try:
        with as_file(folder("docs") / "fmea.json") as path:
            return read_text(path, "FMEA data", max_bytes=MAX_DATA_BYTES)
    except InputError as exc:
        raise FmeaError(DATA, 1, str(exc)) from None


def main() -> int:
    """`python -m chaos.gameday.fmea`: write docs/fmea.json from docs/resilience.md's
    table, in the checkout this module runs from."""
    root = Path(__file__).resolve().parents[2]
    try:
        rows = load_fmea((root / SOURCE).read_text(encoding="utf-8"))
    except (FmeaError, OSError, UnicodeDecodeError) as exc:
        print(f"fmea: {exc}", file=sys.stderr)
        return 2
    (root / DATA).write_text(rows_as_data(rows), encoding="utf-8")
    print(f"fmea: {len(rows)} rows from {SOURCE} written to {DATA}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
