"""The shared cache store's folder, lock and file: never followed
through a symbolic link, never another user's or writable by group/other, never a
FIFO waited on, and the lock waited for within a bound that says what it waits for
and honours the run's deadline. Real files, real flocks, a real `docket run`."""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
import time

import pytest
import trio
from conftest import KEY_ENV, REAL_KEY
from helpers import read_chain

from docket.cache.shared import SharedStore, StoreBusy, StoreProblem
from docket.policy import load_policy
from docket.receipts.verify import verify
from docket.run.supervisor import shared_cache

NOBODY = 65534


def write_policy(path) -> None:
    path.write_text(
        f'[providers.openai]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        f'key_env = "{KEY_ENV}"\n[cache]\nenabled = true\nscope = "team"\ndir = "store"\n'
    )


@pytest.fixture
def made(tmp_path, monkeypatch) -> SharedStore:
    monkeypatch.setenv(KEY_ENV, REAL_KEY)
    write_policy(tmp_path / "docket.toml")
    store = shared_cache(load_policy(tmp_path / "docket.toml"))
    assert store is not None
    return store


def test_a_symlinked_lock_is_refused_and_creates_nothing(made, tmp_path):
    """Another user's DIR/NAME.lock -> /victim: failed before (the run created the
    victim file, as root anywhere)."""
    victim = tmp_path / "victim"
    made.path.parent.mkdir(mode=0o700, exist_ok=True)
    made.lock_path.symlink_to(victim)
    with pytest.raises(StoreProblem, match=r"team\.lock is a symbolic link: refused"):
        made.check()
    assert not victim.exists()


def test_a_symlinked_store_or_folder_is_refused(made, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    made.path.parent.mkdir(mode=0o700, exist_ok=True)
    made.path.symlink_to(elsewhere / "team.json")
    with pytest.raises(StoreProblem, match=r"team\.json is a symbolic link"):
        made.check()
    made.path.unlink()
    made.lock_path.unlink()
    made.path.parent.rmdir()
    made.path.parent.symlink_to(elsewhere)
    with pytest.raises(StoreProblem, match="is a symbolic link or not a folder"):
        made.check()
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize(
    ("spoil", "needle"),
    [
        (lambda s: s.path.parent.chmod(0o777), "group/other write permission"),
        (lambda s: os.chown(s.path.parent, NOBODY, NOBODY), "belongs to another user"),
        (lambda s: s.lock_path.chmod(0o666), "team.lock has group/other write"),
        (lambda s: os.chown(s.lock_path, NOBODY, NOBODY), "team.lock belongs to another"),
        (lambda s: os.chown(s.path, NOBODY, NOBODY), "team.json belongs to another user"),
        (lambda s: s.path.chmod(0o640), "team.json has group/other permissions"),
    ],
    ids=["folder-mode", "folder-owner", "lock-mode", "lock-owner", "store-owner", "store-mode"],
)
def test_owner_and_mode_are_checked_on_the_folder_and_both_files(made, spoil, needle):
    """Failed before for the folder and the lock (not checked)."""
    made.path.parent.mkdir(mode=0o700, exist_ok=True)
    made.lock_path.touch(mode=0o600)
    made.path.write_text("{}")
    made.path.chmod(0o600)
    spoil(made)
    with pytest.raises(StoreProblem, match=needle.replace(".", r"\.")) as refused:
        made.check()
    assert "\n" not in str(refused.value)


def test_a_fifo_in_place_of_the_lock_or_the_store_is_refused_not_waited_on(made):
    made.path.parent.mkdir(mode=0o700, exist_ok=True)
    os.mkfifo(made.path, 0o600)
    with pytest.raises(StoreProblem, match=r"team\.json is not a regular file"):
        made.check()
    made.lock_path.unlink()  # made by that check
    os.mkfifo(made.lock_path, 0o600)
    with pytest.raises(StoreProblem, match=r"team\.lock is not a regular file"):
        made.check()


class Held:
    """Another process's turn on the lock: an flock on its own descriptor."""

    def __init__(self, store: SharedStore) -> None:
        store.path.parent.mkdir(mode=0o700, exist_ok=True)
        self.fd = os.open(store.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        fd, self.fd = self.fd, -1
        os.close(fd)


def test_a_held_lock_is_waited_for_within_its_bound(made):
    """Failed before: check() blocked for as long as the lock was held."""
    held = Held(made)
    try:
        with pytest.raises(StoreBusy):  # asked not to wait: at once
            made.check()
        said = []
        made.lock_wait = 0.3
        start = time.monotonic()
        with pytest.raises(StoreProblem, match=r"another process held its lock team\.lock"):
            made.check(None, lambda: said.append(time.monotonic()))
        waited = time.monotonic() - start
        assert len(said) == 1 and 0.3 <= waited < 2, waited
        # the run's deadline, when sooner, is the bound
        start = time.monotonic()
        with pytest.raises(StoreProblem):
            made.check(time.monotonic() + 0.05, lambda: None)
        assert time.monotonic() - start < 0.3
        # released while waited for: the wait ends there
        made.lock_wait = 10
        timer = threading.Timer(0.2, held.release)
        timer.start()
        assert made.check(None, lambda: None) == 0
        timer.join()
    finally:
        if held.fd >= 0:  # not released by the timer (a check above failed)
            held.release()


async def test_docket_run_says_what_it_waits_for_and_keeps_its_deadline(tmp_path):
    """Another process holds the lock for the whole run: `docket run --max-wall-clock 8`
    says it waits (a line and cache.waiting), gives up within a quarter of its deadline
    (cache.refused),
    runs the agent without the store and ends with a receipt. Failed before: it hung
    before the start, printed nothing and ignored --max-wall-clock."""
    policy = tmp_path / "docket.toml"
    write_policy(policy)
    store = shared_cache(load_policy(policy))
    assert store is not None
    held = Held(store)
    folder = tmp_path / "r"
    argv = [sys.executable, "-m", "docket", "run", "--policy", str(policy), "--max-wall-clock",
            "8", "--ledger-dir", str(folder), "--", sys.executable, "-c", "print('ran')"]  # fmt: skip
    env = {**os.environ, KEY_ENV: REAL_KEY}
    try:
        with trio.fail_after(30):
            start = time.monotonic()
            done = await trio.run_process(
                argv, env=env, capture_stdout=True, capture_stderr=True, check=False
            )
            took = time.monotonic() - start
    finally:
        held.release()
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert "Traceback" not in err
    assert "waiting for the cache store" in err and "team.lock" in err, err
    assert "the run goes on without the store" in err, err
    assert done.stdout.decode().strip() == "ran"
    assert took < 15, took
    events = read_chain(folder / "ledger.jsonl")
    types = [e["type"] for e in events]
    assert (
        types.index("cache.waiting") < types.index("cache.refused") < types.index("process.spawn")
    )
    (waiting,) = [e for e in events if e["type"] == "cache.waiting"]
    assert waiting["wait_s"] == 2 and waiting["lock"].endswith("team.lock")
    assert verify(folder / "receipt.json").ok
    assert json.loads((folder / "receipt.json").read_text())["run_id"]
