"""docket.durable.replace_file: the whole new file or the old one, never a part, and
nothing left beside it when a write fails (a full disk, an I/O error)."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from docket import durable
from docket.durable import replace_file


def test_the_file_is_replaced_whole_and_owner_only(tmp_path):
    target = tmp_path / "receipt.json"
    target.write_bytes(b"old\n")
    replace_file(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["receipt.json"]


@pytest.mark.parametrize("failing", ["fchmod", "fsync", "replace"])
def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, failing):
    target = tmp_path / "restore.json"
    target.write_bytes(b"old\n")

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable.os, failing, no_space)
    with pytest.raises(OSError) as caught:
        replace_file(target, b"new\n")
    assert caught.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"old\n"
    assert os.listdir(tmp_path) == ["restore.json"]


@pytest.mark.parametrize("failing", [None, "fsync", "replace"])
def test_replace_file_at_stays_in_the_folder_it_was_given(tmp_path, monkeypatch, failing):
    """Relative to a folder's descriptor: the folder renamed and a symbolic link put in
    its place after it was opened (another user redirecting the shared cache store)
    changes nothing; a failed write leaves the old file and no temporary."""
    folder, elsewhere = tmp_path / "store", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    (folder / "team.json").write_bytes(b"old\n")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        folder.rename(tmp_path / "moved")
        folder.symlink_to(elsewhere)
        if failing is not None:

            def no_space(*args, **kwargs):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            monkeypatch.setattr(durable.os, failing, no_space)
            with pytest.raises(OSError):
                durable.replace_file_at(fd, "team.json", b"new\n")
            assert (tmp_path / "moved" / "team.json").read_bytes() == b"old\n"
        else:
            durable.replace_file_at(fd, "team.json", b"new\n")
            assert (tmp_path / "moved" / "team.json").read_bytes() == b"new\n"
            assert stat.S_IMODE((tmp_path / "moved" / "team.json").stat().st_mode) == 0o600
    finally:
        os.close(fd)
    assert os.listdir(tmp_path / "moved") == ["team.json"]
    assert os.listdir(elsewhere) == []
