"""A cgroup v2 leaf per run: every process of the run inside it, ended together.

A process tree can be outrun: a chain deeper than any number of sweep rounds, a
process that forks faster than it is killed, one that re-parents or stops itself.
A cgroup cannot: a forked process is born in its parent's cgroup, and neither
setsid, a double fork nor the death of a parent takes it out (only a write to
another cgroup's `cgroup.procs`, which needs write access to a common ancestor:
root's, for a leaf under root's hierarchy). So where the cgroup2 hierarchy is
mounted and the supervisor may make a group under its own (root, or a delegated
subtree), it makes a leaf `docket-PID-RUN_ID` there (`RunCgroup.create`), and the
launcher (docket.run.launch) moves itself into it before anything else, so the
agent and all it starts are born inside. At the end the leaf is frozen (its
member list then holds still, for the record), killed with `cgroup.kill` (the
kernel SIGKILLs every member, those being forked included), waited on until
`cgroup.events` says `populated 0`, and removed. docket.run.orphans does that;
this module is the leaf's files and nothing more.

`create` returns the reason it could not (no cgroup2 mounted, no permission, a
kernel before 5.14 without `cgroup.kill`), and the run falls back to the
freeze-then-kill loop over its process tree (docket.run.isolation).
"""

from __future__ import annotations

import errno
import os
import re
import sys
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"
OWN_CGROUP = "/proc/self/cgroup"
NEEDED = ("cgroup.procs", "cgroup.events", "cgroup.freeze", "cgroup.kill")


def cgroup2_mount(mountinfo: str) -> str | None:
    """Where the cgroup2 hierarchy is mounted, from /proc/self/mountinfo's text."""
    for line in mountinfo.splitlines():
        before, sep, after = line.partition(" - ")
        fields = before.split()
        if sep and after.split()[:1] == ["cgroup2"] and len(fields) > 4:
            # Octal escapes stand for a space, tab, newline or backslash in a path.
            return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
    return None


def own_cgroup(proc_cgroup: str) -> str | None:
    """This process's cgroup2 group ("/" or "/a/b"), from /proc/self/cgroup's text."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::/"):
            return line[3:]
    return None


def events_say(events: str, key: str) -> bool:
    """True when `cgroup.events` text holds `KEY 1`."""
    return f"{key} 1" in events.splitlines()


LEAF_PREFIX = "docket-"  # then the supervisor's pid, a dash, the run's id
STALE_LEAF = re.compile(re.escape(LEAF_PREFIX) + r"([0-9]+)-")


def remove_stale_leaves(parent: Path) -> None:
    """Remove the empty leaves of supervisors that are gone (one SIGKILLed cannot
    remove its own: its watcher kills the leaf's processes, and the leaf stays).
    A leaf still populated, or whose supervisor's pid is alive, is left alone."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return  # not readable: nothing of ours to tidy there
    for entry in entries:
        match = STALE_LEAF.match(entry.name)
        if match is None or os.path.exists(f"/proc/{match.group(1)}"):
            continue
        try:
            os.rmdir(entry.path)
        except OSError:
            continue  # populated, or removed by another run meanwhile: left as it is


class RunCgroup:
    """The run's leaf: its path, and what the end of a run reads and writes there."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str) -> tuple[RunCgroup | None, str | None]:
        """Make the run's leaf (`name`: the run's id) under this process's own group:
        (the leaf, None) or (None, why not)."""
        if sys.platform != "linux":
            return None, f"cgroups are Linux only (this is {sys.platform})"
        try:
            mount = cgroup2_mount(Path(MOUNTINFO).read_text())
            own = own_cgroup(Path(OWN_CGROUP).read_text())
        except OSError as exc:
            return None, f"cannot read this process's cgroup: {exc.strerror or exc}"
        if mount is None:
            return None, "no cgroup2 hierarchy is mounted"
        if own is None:
            return None, "this process is in no cgroup2 group"
        parent = Path(mount) / own.lstrip("/")
        remove_stale_leaves(parent)
        leaf = parent / f"{LEAF_PREFIX}{os.getpid()}-{name}"
        try:
            leaf.mkdir(mode=0o755)
        except OSError as exc:
            return None, f"cannot make {leaf}: {exc.strerror or exc}"
        missing = [f for f in NEEDED if not (leaf / f).exists()]
        if missing:
            why = f"{leaf} has no {', '.join(missing)} (cgroup.kill needs Linux 5.14)"
            removed = cls(leaf).remove()
            return None, why if removed is None else f"{why}; {removed}"
        if not os.access(leaf / "cgroup.procs", os.W_OK):
            cls(leaf).remove()
            return None, f"cannot move a process into {leaf}"
        return cls(leaf), None

    def _read(self, name: str) -> str:
        return (self.path / name).read_text()

    def _write(self, name: str, value: str) -> None:
        fd = os.open(self.path / name, os.O_WRONLY)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def members(self) -> list[int]:
        """The live processes in the leaf (one that has exited is not listed)."""
        try:
            return [int(p) for p in self._read("cgroup.procs").split()]
        except FileNotFoundError:
            return []  # removed: nobody is in it

    def populated(self) -> bool:
        try:
            return events_say(self._read("cgroup.events"), "populated")
        except FileNotFoundError:
            return False

    def frozen(self) -> bool:
        return events_say(self._read("cgroup.events"), "frozen")

    def freeze(self) -> None:
        """Stop every member where it stands (none can fork): the kernel's freezer."""
        self._write("cgroup.freeze", "1")

    def kill(self) -> None:
        """SIGKILL every member, those being forked included."""
        self._write("cgroup.kill", "1")

    def remove(self) -> str | None:
        """Remove the leaf (empty by then): None, or why it could not be."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return None  # removed already
        except OSError as exc:
            busy = " (processes are still in it)" if exc.errno == errno.EBUSY else ""
            return f"cannot remove {self.path}: {exc.strerror or exc}{busy}"
        return None
