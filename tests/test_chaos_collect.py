"""Reading a run folder back (chaos.run.collect): what a killed writer leaves is a note,
anything else that is not what the harness wrote is an error naming file and line."""

from __future__ import annotations

import pytest

from chaos.run.collect import read_agent_pids, read_jsonl
from docket.errors import InputError


def test_a_torn_last_line_is_left_out_and_noted(tmp_path):
    log = tmp_path / "stub-openai.jsonl"
    log.write_bytes(b'{"seq":0}\n{"seq":1}\n{"seq":2,"pa')
    notes: list[str] = []
    assert read_jsonl(log, notes) == [{"seq": 0}, {"seq": 1}]
    (note,) = notes
    assert note.startswith("stub-openai.jsonl: line 3 is torn (12 bytes without a newline")


def test_a_last_line_without_its_newline_is_torn_even_if_it_parses(tmp_path):
    # its writer writes the newline with the line: without it, the write was cut
    log = tmp_path / "injected.jsonl"
    log.write_bytes(b'{"a":1}\n{"a":2}')
    notes: list[str] = []
    assert read_jsonl(log, notes) == [{"a": 1}]
    assert len(notes) == 1 and "line 2 is torn" in notes[0]


def test_whole_files_blank_lines_and_a_missing_file_give_no_note(tmp_path):
    log = tmp_path / "probes.jsonl"
    log.write_bytes(b'{"t":0.1}\n\n{"t":0.2}\n')
    notes: list[str] = []
    assert read_jsonl(log, notes) == [{"t": 0.1}, {"t": 0.2}]
    assert read_jsonl(tmp_path / "absent.jsonl", notes) == []
    assert notes == []


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"seq":0}\n{"seq":1,\n{"seq":2}\n', ":2: not a JSON line"),
        (b'{"seq":0}\n[1, 2]\n', ":2: not a JSON object"),
        (b'\xff\xfe{"seq":0}\n{"seq":1}\n', ":1: not a JSON line"),
    ],
)
def test_a_malformed_line_before_the_last_is_an_error_naming_file_and_line(
    tmp_path, content, reason
):
    log = tmp_path / "stub-openai.jsonl"
    log.write_bytes(content)
    with pytest.raises(InputError) as info:
        read_jsonl(log, [])
    message = str(info.value)
    assert message.startswith(f"{log}{reason}") and "\n" not in message


def test_agent_pids_are_read_by_name_and_junk_is_noted(tmp_path):
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "hammer.pid").write_text("4242\n")
    (agents / "polite.pid").write_text("17")
    (agents / "broken.pid").write_text("not a pid")
    (agents / "hammer.out").write_text("{}\n")  # not a pid file
    notes: list[str] = []
    assert read_agent_pids(tmp_path, notes) == {"hammer": 4242, "polite": 17}
    assert notes == ["agents/broken.pid: 'not a pid' is not a pid"]
