"""Family `snapshot`: what an agent of the same user can do to the snapshot store, the run
folder's snapshot records and the tree, each tried against a real rollback or a real
`docket restore`.

Each probe builds a tree and a folder beside it that must never change ("outside"),
takes a real snapshot into a real store, and plays the agent: FIFOs, symlinks and
other bytes where store objects were, a store folder swapped for a link out, trees
1,000 levels deep, paths longer than PATH_MAX, names that are not UTF-8, FIFOs,
sockets and devices in the tree, hard links out, files made after the change scan;
or, against `docket restore` on a run folder written by the real ledger writer:
FIFOs and links in place of the ledger and the record, records edited to name
another store, another exclude. Each runs in a thread joined with a deadline.

Held, for a rollback: it ended within the deadline; nothing outside changed; its
`verified` is true exactly when the tree equals the snapshot, read by this family's
own walk (bytes names, fds, no recursion), and when false, every path left different
is named (`failed` or `differences`); and where the probe says what must come of it
(restorable: verified; not: named), that. For a restore: it ended within the
deadline, nothing outside changed (nor anything made where an edited record
pointed), and its outcome is the one wanted (refused with one line, or done).
A store (or its objects/ or tmp/) planted as a link out before the next run: the
snapshot is refused and nothing is written there. The full form adds a real
`docket run` whose agent turns the store's objects into FIFOs: it must end with its
receipt within the deadline. `docket prune --apply` against a planted store:
snapshot_prune.py.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import resource
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaos.attack import Figures
from chaos.attack.snapshot_kit import DEADLINE, bounded, fingerprint, make_tree
from chaos.attack.snapshot_prune import PRUNES, try_prune


def chain(base: Path, levels: int, name: str = "d") -> list[str]:
    """`levels` nested directories `name` under base, made relative to directory fds
    (the whole path may be longer than the kernel takes), a file at the bottom."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir(name, dir_fd=fd)
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        f = os.open("bottom", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(f, b"far down\n")
        os.close(f)
    finally:
        os.close(fd)
    return [name] * levels + ["bottom"]


def write_at(root: Path, parts: list[str], data: bytes) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        f = os.open(parts[-1], os.O_WRONLY | os.O_TRUNC, dir_fd=fd)
        os.write(f, data)
        os.close(f)
    finally:
        os.close(fd)


def objects_of(store: Path) -> list[Path]:
    return [p for p in (store / "objects").rglob("*") if p.is_file()]


def object_of(snap, path: str) -> Path:
    return snap.store.object_path(snap.before.entries[path].sha256)


def to_fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p)


def mknod_null(p: Path) -> None:
    os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 3))


def bound_socket(p: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.fsdecode(p))
    s.close()


# ------------------------------------------------------------------ rollback probes


@dataclass
class Rollback:
    """`before(tree, outside)`: the tree before the snapshot; `agent(tree, snap, outside)`:
    what the run does; `late(tree, snap, outside)`: after the change scan (a process
    outside the run, or the agent's hold on the store). `restorable`: whether a correct
    rollback brings the tree back (verified must then be true); else it must be false,
    with the path in `named` among what it names."""

    name: str
    agent: Callable
    restorable: bool = True
    late: Callable | None = None
    before: Callable | None = None
    named: str | None = None
    quick: bool = False


def _replace_object(bytes_: bytes) -> Callable:
    def late(tree, snap, outside):
        p = object_of(snap, "README")
        p.chmod(0o600)
        p.write_bytes(bytes_)

    return late


def _objects_dir_out(tree, snap, outside):
    sha = snap.before.entries["README"].sha256
    d = snap.store.root / "objects" / sha[:2]
    elsewhere = outside.parent / "objects-copy"  # beside the outside: its own bytes move
    shutil.copytree(d, elsewhere)
    shutil.rmtree(d)
    os.symlink(elsewhere, d)


def _object_link(target: str) -> Callable:
    def late(tree, snap, outside):
        p = object_of(snap, "README")
        p.unlink()
        os.symlink(target, p)

    return late


def _object_hardlink_out(tree, snap, outside):
    p = object_of(snap, "README")
    p.unlink()
    os.link(outside / "secret", p)


def _rewrite_readme(tree, snap=None, outside=None):
    (tree / "README").write_text("changed by the run\n")


def _non_utf8(tree, snap, outside):
    raw = os.fsencode(tree)
    os.mkdir(raw + b"/evil\xff")
    with open(raw + b"/evil\xff/payload.sh", "wb") as f:
        f.write(b"rm -rf ~\n")
    os.rename(tree / "README", os.fsdecode(raw + b"/READ\xfeME"))
    os.symlink(b"/tmp/\xff", raw + b"/bad-target")
    os.mkdir(raw + b"/ctl\nname")


def _kinds(tree, snap, outside):
    os.mkfifo(tree / "pipe")
    bound_socket(tree / "sock")
    try:
        mknod_null(tree / "null")
    except PermissionError:
        (tree / "null").write_text("mknod not permitted: a file instead")
    os.unlink(tree / "src" / "run.sh")
    os.mkfifo(tree / "src" / "run.sh")  # a FIFO where a file was


def _hardlink_out(tree, snap, outside):
    os.unlink(tree / "README")
    os.link(outside / "secret", tree / "README")


def _dir_to_link_out(tree, snap, outside):
    shutil.rmtree(tree / "src")
    os.symlink(outside, tree / "src")


def _late_file_and_fifo(tree, snap, outside):
    (tree / "late.txt").write_text("made after the change scan\n")
    os.mkfifo(tree / "late-pipe")


def _deep_made(levels: int) -> Callable:
    def agent(tree, snap, outside):
        (tree / "made").mkdir()
        chain(tree / "made", levels)
        os.mkfifo(tree / "made" / "pipe")

    return agent


def _deep_before(tree, outside):
    (tree / "deep").mkdir()
    chain(tree / "deep", 1000)


def _long_before(tree, outside):
    chain(tree, 20, "n" * 250)


def _long_edit(tree, snap, outside):
    write_at(tree, ["n" * 250] * 20 + ["bottom"], b"changed by the run\n")
    chain(tree / "src", 20, "m" * 250)  # and a long path the run made


def _backslash_names(tree, outside):
    (tree / "a\\b").write_text("a backslash in a name\n")
    (tree / "\\x41").write_text("an escape's spelling as a name\n")


def _backslash_edit(tree, snap, outside):
    (tree / "a\\b").write_text("changed\n")
    os.unlink(tree / "\\x41")


ROLLBACKS = [
    Rollback("store object a FIFO", _rewrite_readme, False,
             lambda t, s, o: to_fifo(object_of(s, "README")), named="README", quick=True),
    Rollback("store object other bytes", _rewrite_readme, False,
             _replace_object(b"planted\n"), named="README", quick=True),
    Rollback("store object a link to /dev/zero", _rewrite_readme, False,
             _object_link("/dev/zero"), named="README"),
    Rollback("store object a link to an outside file", _rewrite_readme, False,
             _object_link("/etc/hostname"), named="README"),
    Rollback("store object a hard link to an outside file", _rewrite_readme, False,
             _object_hardlink_out, named="README"),
    Rollback("store objects/xx a link out", _rewrite_readme, False,
             _objects_dir_out, named="README", quick=True),
    Rollback("names not UTF-8, control characters", _non_utf8, quick=True),
    Rollback("FIFO, socket, device added; file turned FIFO", _kinds, quick=True),
    Rollback("a file hard-linked to an outside file", _hardlink_out),
    Rollback("a directory swapped for a link out", _dir_to_link_out, quick=True),
    Rollback("a file and a FIFO made after the change scan", _rewrite_readme, False,
             _late_file_and_fifo, named="late-pipe", quick=True),
    Rollback("a 1,000-level tree the run made", _deep_made(1000)),
    Rollback("a 300-level tree the run made", _deep_made(300), quick=True),
    Rollback("a 1,000-level tree before the run", _rewrite_readme, before=_deep_before),
    Rollback("paths over 4,096 bytes", _long_edit, before=_long_before, quick=True),
    Rollback("backslashes in names", _backslash_edit, before=_backslash_names),
]  # fmt: skip


def try_rollback(base: Path, probe: Rollback) -> tuple[bool, str]:
    from docket.snapshot.run import changes, rollback, take

    tree, outside = make_tree(base / "tree"), base / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside bytes\n")
    if probe.before:
        probe.before(tree, outside)
    snap, _ = take(0, str(tree), base / "run", base / "store")
    want, out_before = fingerprint(tree), fingerprint(outside)
    probe.agent(tree, snap, outside)
    how, found = bounded(changes, snap)
    if how != "ok":
        return False, f"the change scan {how}: {found!r}"
    if probe.late:
        probe.late(tree, snap, outside)
    how, result = bounded(rollback, snap)
    if how != "ok":
        return False, f"the rollback {how}: {result!r}"
    assert isinstance(result, dict)
    equal = fingerprint(tree) == want
    named = {d["path"] for d in result.get("differences") or []}
    named |= {f["path"] for f in result["failed"]}
    said = (f"verified {result['verified']}, tree equal {equal}, failed "
            f"{[f['path'] for f in result['failed']][:3]}, differences {sorted(named)[:3]}")  # fmt: skip
    if fingerprint(outside) != out_before:
        return False, "the outside changed; " + said
    if result["verified"] != equal:
        return False, said
    if not result["verified"] and not named and not result.get("error"):
        return False, "not verified and nothing named; " + said
    if probe.restorable and not result["verified"]:
        return False, "a restorable change was not undone; " + said
    if not probe.restorable and (result["verified"] or (probe.named and probe.named not in named)):
        return False, f"{probe.named} not named; " + said
    return True, said


# ------------------------------------------------------------------ restore probes


@dataclass
class Restore:
    """`spoil(folder, snap, outside)`: what the agent does to the run folder or the store
    after the run; `wanted`: "refused" (one InputError line, exit 2) or an exit code."""

    name: str
    spoil: Callable
    wanted: str | int
    apply: bool = False
    force: bool = False
    only: list[str] | None = None
    agent: Callable = _rewrite_readme
    scanned: bool = True
    quick: bool = False


def _record(folder: Path) -> Path:
    return folder / "snapshots" / "0.json"


def _edit_record(field: str, value) -> Callable:
    def spoil(folder, snap, outside):
        data = json.loads(_record(folder).read_text())
        data[field] = value(outside) if callable(value) else value
        _record(folder).write_text(json.dumps(data, sort_keys=True, ensure_ascii=False) + "\n")

    return spoil


def _record_link(folder, snap, outside):
    shutil.copy(_record(folder), outside / "0.json")
    _record(folder).unlink()
    os.symlink(outside / "0.json", _record(folder))


def _no_store(folder, snap, outside):
    shutil.rmtree(snap.store.root)


def _nothing(folder, snap, outside):
    return None


def _deep_agent(tree, snap=None, outside=None):
    (tree / "made").mkdir()
    chain(tree / "made", 1000)


def _long_agent(tree, snap=None, outside=None):
    write_at(tree, ["n" * 250] * 20 + ["bottom"], b"changed by the run\n")


RESTORES = [
    Restore("record a FIFO", lambda f, s, o: to_fifo(_record(f)), "refused", quick=True),
    Restore("ledger a FIFO", lambda f, s, o: to_fifo(f / "ledger.jsonl"), "refused", quick=True),
    Restore("record a link to a copy outside", _record_link, "refused"),
    Restore("record's store edited to point outside",
            _edit_record("store", lambda o: str(o / "planted" / "store")), "refused", quick=True),
    Restore("record's exclude edited", _edit_record("exclude", ["*"]), "refused"),
    Restore("record's skipped edited", _edit_record("skipped", [{"path": "x", "why": "y"}]), "refused"),
    Restore("a field added to the record", _edit_record("extra", 1), "refused"),
    Restore("dry run with the store gone", _no_store, 0, quick=True),
    Restore("apply with a store object a FIFO",
            lambda f, s, o: to_fifo(object_of(s, "README")), 1, apply=True, quick=True),
    Restore("a 1,000-level tree, no change scan", _nothing, 0, apply=True, force=True,
            agent=_deep_agent, scanned=False),
    Restore("--only a path over 4,096 bytes", _nothing, 0, apply=True,
            only=["/".join(["n" * 250] * 20 + ["bottom"])], agent=_long_agent, quick=True),
]  # fmt: skip


def try_restore(base: Path, probe: Restore) -> tuple[bool, str]:
    import trio

    from docket.errors import InputError
    from docket.ledger.writer import open_ledger
    from docket.snapshot.command import restore_command
    from docket.snapshot.run import changes, take

    tree, outside = make_tree(base / "tree"), base / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside bytes\n")
    if probe.agent is _long_agent:
        chain(tree, 20, "n" * 250)
    folder = base / "run"
    folder.mkdir()
    snap, taken = take(0, str(tree), folder, base / "store")
    want = fingerprint(tree)
    probe.agent(tree, snap, outside)
    found = changes(snap)

    async def write() -> None:
        async with open_ledger(folder / "ledger.jsonl") as ledger:
            await ledger.append("session.start")
            await ledger.append("snapshot.taken", **taken)
            if probe.scanned:
                await ledger.append("snapshot.changes", **found)

    trio.run(write)
    probe.spoil(folder, snap, outside)
    out_before = fingerprint(outside)  # what the spoiling put there is the baseline
    with contextlib.redirect_stdout(io.StringIO()):  # its plan, printed: not the figures
        how, result = bounded(
            restore_command, str(folder), apply=probe.apply, only=probe.only, force=probe.force
        )
    if how == "hung":
        return False, f"did not end within {DEADLINE} s"
    if fingerprint(outside) != out_before or (outside / "planted").exists():
        return False, "wrote outside the tree"
    if how == "raised":
        ok = probe.wanted == "refused" and isinstance(result, InputError)
        return ok, f"raised {type(result).__name__}: {result}"
    said = f"exit {result}"
    if probe.wanted == "refused" or result != probe.wanted:
        return False, said
    if probe.wanted == 0 and probe.apply and fingerprint(tree) != want and not probe.only:
        return False, said + " but the tree is not the snapshot's"
    if probe.spoil is _no_store and snap.store.root.exists():
        return False, said + " but the dry run made the store again"
    return True, said


# ------------------------------------------------------------------ the next run's store


def try_planted_store(base: Path, where: str) -> tuple[bool, str]:
    """A previous run's agent makes the shared store (or its objects/ or tmp/) a link to
    elsewhere: the next snapshot must be refused before it copies anything there."""
    from docket.snapshot.run import take
    from docket.snapshot.store import StoreError

    tree, elsewhere, store = make_tree(base / "tree"), base / "elsewhere", base / "store"
    elsewhere.mkdir()
    if where:
        store.mkdir()
    os.symlink(elsewhere, store / where if where else store)
    how, result = bounded(take, 0, str(tree), base / "run", store)
    written = sorted(p.name for p in elsewhere.iterdir())
    ok = how == "raised" and isinstance(result, StoreError) and not written
    return ok, f"{how} {result!r}, written there: {written[:3]}"


# ------------------------------------------------------------------ one real docket run

FIFO_AGENT = r"""
import os, sys, time
store = sys.argv[1]
open("README", "w").write("changed by the agent\n")
for here, dirs, files in os.walk(os.path.join(store, "objects")):
    for name in files:
        os.unlink(os.path.join(here, name))
        os.mkfifo(os.path.join(here, name))
time.sleep(60)
"""


def try_docket_run(base: Path) -> tuple[bool, str]:
    tree = make_tree(base / "tree")
    run, store = base / "runs" / "r1", base / "runs" / ".docket-snapshot-store"
    agent = base / "agent.py"
    agent.write_text(FIFO_AGENT)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "docket",
            "run",
            "--ledger-dir",
            str(run),
            f"--snapshot={tree}",
            "--rollback-on-breach",
            "--max-wall-clock",
            "2",
            "--",
            sys.executable,
            str(agent),
            str(store),
        ],  # fmt: skip
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=DEADLINE + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return False, "docket run did not end"
    receipt = run / "receipt.json"
    if proc.returncode != 42 or not receipt.is_file():
        return False, f"exit {proc.returncode}, receipt {receipt.is_file()}: {err[-300:]}"
    restored = json.loads(receipt.read_text())["snapshot"][0]["restored"]
    return restored["verified"] is False, f"exit 42, receipt restored {restored}"


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        target = hard if hard != resource.RLIM_INFINITY else 1 << 16
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(target, 1 << 16), hard))
        except (ValueError, OSError) as exc:  # this family's own walk wants more fds
            if getattr(exc, "errno", None) not in (errno.EPERM, None):
                raise


def _clean(path: Path) -> None:
    # The trees are deeper than shutil.rmtree's recursion takes: rm -rf iterates.
    subprocess.run(["rm", "-rf", "--", str(path)], check=False, timeout=120)


def run(folder: Path, quick: bool) -> Figures:
    figures = Figures("snapshot")
    _raise_nofile()
    folder.mkdir(parents=True, exist_ok=True)
    held = {"rollback": 0, "restore": 0, "store planted": 0, "docket run": 0}
    for n, rb in enumerate(p for p in ROLLBACKS if p.quick or not quick):
        base = folder / f"rollback{n:02d}"
        try:
            good, said = try_rollback(base, rb)
        except Exception as exc:  # noqa: BLE001 - a probe that crashes Docket is not held
            good, said = False, f"raised {type(exc).__name__}: {str(exc)[:200]}"
        finally:
            _clean(base)
        held["rollback"] += good
        figures.add(good, f"snapshot rollback: {rb.name} -> {said}")
    for n, rs in enumerate(p for p in RESTORES if p.quick or not quick):
        base = folder / f"restore{n:02d}"
        try:
            good, said = try_restore(base, rs)
        except Exception as exc:  # noqa: BLE001 - a probe that crashes Docket is not held
            good, said = False, f"raised {type(exc).__name__}: {str(exc)[:200]}"
        finally:
            _clean(base)
        held["restore"] += good
        figures.add(good, f"snapshot restore: {rs.name} -> {said}")
    for where in ("", "objects") if quick else ("", "objects", "tmp"):
        base = folder / f"planted-{where or 'root'}"
        try:
            good, said = try_planted_store(base, where)
        finally:
            _clean(base)
        held["store planted"] += good
        figures.add(good, f"snapshot store planted as a link ({where or 'the store'}) -> {said}")
    held["prune"] = 0
    for n, pr in enumerate(p for p in PRUNES if p.quick or not quick):
        base = folder / f"prune{n:02d}"
        try:
            good, said = try_prune(base, pr)
        except Exception as exc:  # noqa: BLE001 - a probe that crashes Docket is not held
            good, said = False, f"raised {type(exc).__name__}: {str(exc)[:200]}"
        finally:
            _clean(base)
        held["prune"] += good
        figures.add(good, f"snapshot prune --apply: {pr.name} -> {said}")
    if not quick:
        base = folder / "docket-run"
        try:
            good, said = try_docket_run(base)
        finally:
            _clean(base)
        held["docket run"] += good
        figures.add(good, f"snapshot docket run: store objects FIFOs -> {said}")
    figures.extra = {"held": held}
    return figures
