"""Every verb that reads a run takes its folder, its ledger or its receipt the same way
(docket/reading/run_paths.py); what is missing is one line naming it, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reading_ledgers import Script, seal

from docket.cli import main


def _run(folder: Path, calls: int) -> Path:
    folder.mkdir()
    s = Script()
    for i in range(calls):
        s.call(body=f"q {i}")
    seal(s.end().write(folder / "ledger.jsonl"))
    return folder


@pytest.fixture
def runs(tmp_path) -> tuple[Path, Path]:
    return _run(tmp_path / "a1", 2), _run(tmp_path / "b1", 3)


FORMS = {
    "folder": lambda run: run,
    "ledger": lambda run: run / "ledger.jsonl",
    "receipt": lambda run: run / "receipt.json",
}


@pytest.mark.parametrize("form", FORMS)
def test_verify_takes_each_form(runs, form, capsys):
    assert main(["verify", str(FORMS[form](runs[0]))]) == 0
    assert capsys.readouterr().out.startswith("ok")


@pytest.mark.parametrize("form", FORMS)
def test_verify_json_takes_each_form(runs, form, capsys):
    assert main(["verify", "--json", str(FORMS[form](runs[0]))]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "ok"


def test_verify_a_ledger_checks_that_ledger(runs, capsys):
    """Named by its ledger, the run is verified against that file, not a copy the
    receipt names: a tampered ledger fails."""
    ledger = runs[0] / "ledger.jsonl"
    data = bytearray(ledger.read_bytes())
    at = data.index(b'"input_tokens":7')
    data[at + 15] = ord("9")
    ledger.write_bytes(bytes(data))
    assert main(["verify", str(ledger)]) == 1
    assert not capsys.readouterr().out.startswith("ok")


@pytest.mark.parametrize("form", FORMS)
def test_diff_takes_each_form(runs, form, capsys):
    a, b = (str(FORMS[form](r)) for r in runs)
    assert main(["diff", "--json", a, b]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any(r["figure"] == "totals.model_calls" for r in report["differences"])
    assert main(["diff", a, a]) == 0


@pytest.mark.parametrize("form", FORMS)
def test_doctor_takes_each_form(runs, form, capsys):
    assert main(["doctor", "--json", str(FORMS[form](runs[0]))]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "clean"


@pytest.mark.parametrize("form", FORMS)
def test_explain_takes_each_form(runs, form, capsys):
    assert main(["explain", "--json", str(FORMS[form](runs[1]))]) == 0
    assert json.loads(capsys.readouterr().out)["model_calls"] == 3


@pytest.mark.parametrize("form", FORMS)
def test_show_takes_each_form(runs, form, capsys):
    assert main(["show", "--json", str(FORMS[form](runs[0]))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert json.loads(lines[-1])["type"] == "session.end"


VERBS = {
    "verify": ["verify"],
    "verify --json": ["verify", "--json"],
    "diff": ["diff"],
    "doctor": ["doctor"],
    "explain": ["explain"],
    "show": ["show"],
}


def _argv(verb: str, target: Path, other: Path) -> list[str]:
    if verb == "diff":
        return ["diff", str(target), str(other)]
    return [*VERBS[verb], str(target)]


def _one_line_exit_2(argv: list[str], capsys, *needles: str) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    text = out if "--json" in argv else err
    assert text.count("\n") == 1, text
    assert "Traceback" not in text
    for needle in needles:
        assert needle in text, (needle, text)


@pytest.mark.parametrize("verb", VERBS)
def test_nothing_there_is_one_line(runs, verb, tmp_path, capsys):
    target = tmp_path / "nowhere"
    _one_line_exit_2(_argv(verb, target, runs[0]), capsys, "no such file or folder")


@pytest.mark.parametrize("verb", VERBS)
def test_folder_without_what_the_verb_needs(runs, verb, tmp_path, capsys):
    empty = tmp_path / "not-a-run"
    empty.mkdir()
    needs = "receipt.json" if verb.startswith(("verify", "diff")) else "ledger.jsonl"
    _one_line_exit_2(_argv(verb, empty, runs[0]), capsys, f"no {needs} in this folder")


@pytest.mark.parametrize("verb", ["verify", "diff"])
def test_ledger_without_receipt_beside_it(runs, verb, capsys):
    (runs[0] / "receipt.json").unlink()
    target = runs[0] / "ledger.jsonl"
    _one_line_exit_2(_argv(verb, target, runs[1]), capsys, "no receipt.json beside ledger.jsonl")


@pytest.mark.parametrize("verb", ["doctor", "explain", "show"])
def test_receipt_whose_ledger_is_gone(runs, verb, capsys):
    (runs[0] / "ledger.jsonl").unlink()
    target = runs[0] / "receipt.json"
    _one_line_exit_2(_argv(verb, target, runs[1]), capsys, "the ledger it names", "is not there")


@pytest.mark.parametrize("verb", VERBS)
def test_empty_file_in_a_folder(runs, verb, capsys):
    """The file the verb reads first is empty: the receipt for verify and diff, the
    ledger for the others."""
    name = "receipt.json" if verb.startswith(("verify", "diff")) else "ledger.jsonl"
    (runs[0] / name).write_bytes(b"")
    _one_line_exit_2(_argv(verb, runs[0], runs[1]), capsys, f"{name}: is empty")


@pytest.mark.parametrize("verb", VERBS)
def test_binary_file_is_one_line(runs, verb, tmp_path, capsys):
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x00\x01\x02\xff" * 100)
    _one_line_exit_2(_argv(verb, binary, runs[0]), capsys, str(binary))


def test_receipt_naming_no_ledger(runs, tmp_path, capsys):
    odd = tmp_path / "odd.json"
    odd.write_text('{"hello": "world"}\n')
    _one_line_exit_2(["show", str(odd)], capsys, "names no ledger")


@pytest.mark.parametrize("form", FORMS)
def test_export_takes_each_form(runs, form):
    from otlp_receiver import otlp_receiver  # opentelemetry-proto: this test only

    with otlp_receiver() as (url, got):
        assert main(["export", "otel", str(FORMS[form](runs[1])), "--endpoint", url]) == 0
    calls = [s for s in got.spans() if s.parent_span_id]  # the run's span has no parent
    assert len(calls) == 3
