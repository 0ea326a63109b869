"""The README and docs/ name only files and tests that are in the tree.

A renamed module or test leaves its old name in the prose, where nothing fails; this test
is what fails. It reads README.md and docs/*.md (the ADRs under docs/adr/ record the tree
as it was when each was written, so their old paths are history, not errors) and checks
every path under one of the tree's top folders, and every `test_*` name, against the files.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = "docket|chaos|tests|benchmarks|spec|gamedays|verify-go|verify-js|examples|scenarios"
# A path starts a word (not `/docket/healthz`, a URL path) and ends before punctuation.
PATH = re.compile(rf"(?<![/\w.-])(?:{TOP})/[A-Za-z0-9_./*-]+")
TEST_NAME = re.compile(r"(?<![\w/.-])test_[a-z0-9_]*[a-z0-9](?!\w|\.py|\()")
# Placeholders, globs and format names that look like paths: `tests/test_NAME.py`,
# `tests/test_keys_*.py`, `docket/restore/v1`.
NOT_A_PATH = re.compile(r"/(\w*_)?[A-Z]{1,4}(\.|/|-|$)|\*|^docket/restore/v\d+$")
NOT_A_TEST = {"test_workers"}  # noxfile.py's, named in docs/testing.md
# What the tree's commands write (benchmarks/results/, gameday-report/): named in the docs,
# absent from a fresh clone, so held to .gitignore instead of to the disk.
OUTPUTS = tuple(
    line.strip().rstrip("/")
    for line in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    if line.strip().endswith("/") and "*" not in line
)


def exists_or_output(path: str) -> bool:
    return (ROOT / path).exists() or path.rstrip("/").startswith(OUTPUTS)


def paths_in(text: str) -> set[str]:
    paths = {m.rstrip(".") for m in PATH.findall(text)}
    return {p for p in paths if not NOT_A_PATH.search(p)}


def cited_tests(text: str) -> set[str]:
    return set(TEST_NAME.findall(text)) - NOT_A_TEST


def defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").glob("*.py"):
        names.update(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M))
        names.add(path.stem)
    return names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_and_test_a_doc_names_exists(doc):
    text = doc.read_text(encoding="utf-8")
    missing = sorted(p for p in paths_in(text) if not exists_or_output(p))
    assert not missing, f"{doc.name} names paths not in the tree: {missing}"
    unknown = sorted(cited_tests(text) - defined_tests())
    assert not unknown, f"{doc.name} names tests not in tests/: {unknown}"


def test_the_reader_finds_what_it_is_meant_to():
    # On a known text the patterns find the paths and names and skip URL paths and
    # placeholders, so a pattern that matches nothing cannot pass the test above silently.
    text = (
        "see docket/ledger/chain.py, tests/test_chain.py::test_x and /docket/healthz; "
        "copy tests/test_NAME.py or docket/guards/NAME.py; run test_chain_breaks_on_edit."
    )
    assert paths_in(text) == {"docket/ledger/chain.py", "tests/test_chain.py"}
    assert cited_tests(text) == {"test_x", "test_chain_breaks_on_edit"}
    assert exists_or_output("benchmarks/results/bench.json") and "benchmarks/results" in OUTPUTS
    assert not exists_or_output("docket/no_such_module.py")
    assert sum(len(paths_in(doc.read_text(encoding="utf-8"))) for doc in DOCS) > 50


# "issue 23, item 7" means something only to whoever read the tracker that day; the text
# around it must say what is true instead. Everything a reader opens is held to that.
ISSUE_CITATION = re.compile(r"\b[Ii]ssues? #?\d+")
CITING_FILES = [
    ROOT / "README.md",
    ROOT / "pyproject.toml",
    ROOT / "noxfile.py",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "spec").glob("*.md")),
    *sorted(
        p for top in ("docket", "chaos", "tests", "benchmarks") for p in (ROOT / top).rglob("*.py")
    ),
]


def test_nothing_cites_an_issue_number():
    cited = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in CITING_FILES
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if ISSUE_CITATION.search(line) and path != Path(__file__)
    ]
    assert not cited, f"issue numbers cited (say what is true instead): {cited}"
    assert ISSUE_CITATION.search("see issue 23") and not ISSUE_CITATION.search("tissue 3x")
