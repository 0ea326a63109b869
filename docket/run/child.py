"""The supervised child at the OS level: its environment, its start, its exit, its group.

What the agent is given (`child_env`: the boundary's URLs and a per-run token,
never a provider key); whether its command can exist (`command_missing`);
`Child`, which waits for its exit without blocking trio and reaps it; its exit
in shell terms and in words (`wait_status`, `describe_exit`, `signal_name`);
the live members of its process group (`group_members`, read from /proc); and
the processes that came back to the supervisor as orphans (`children_of`,
`cmdline_of`, `reap_pid`).
How it is spawned, signalled and stopped is docket.run.control's;
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable

import trio

from docket.boundary.proxy import proxy_env
from docket.guards.keys import agent_drops

EXIT_CANNOT_EXEC = 126
EXIT_NOT_FOUND = 127


def child_env(base: dict[str, str], boundary_url: str, token: str, policy) -> dict[str, str]:
    """What the agent sees: base URLs pointing at the boundary and a per-run token, never a key."""
    # The real keys stay with the supervisor: every configured key_env, the well-known
    # provider key names (a key for a provider not configured is still a key) and the
    # policy's secrets.drop_env are dropped (docket.guards.keys).
    drops = agent_drops(policy)
    env = {name: value for name, value in base.items() if name not in drops}
    for name, provider in policy.providers.items():
        if provider.kind == "openai":
            env["OPENAI_BASE_URL"] = f"{boundary_url}/{name}/v1"
            env["OPENAI_API_KEY"] = token
        elif provider.kind == "anthropic":
            env["ANTHROPIC_BASE_URL"] = f"{boundary_url}/{name}"
            env["ANTHROPIC_API_KEY"] = token
    env["DOCKET_BOUNDARY_URL"] = boundary_url
    env["DOCKET_RUN_TOKEN"] = token
    env.update(proxy_env(boundary_url, token))  # other egress goes through the boundary too
    return env


def wait_status(returncode: int) -> int:
    """A shell-style exit status: the child's code, or 128 + the signal that killed it."""
    return returncode if returncode >= 0 else 128 - returncode


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    return f"exited with status {returncode}"


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def command_missing(name: str, path: str) -> bool:
    """True when exec would certainly fail with ENOENT: no such file where execvp looks.

    Only the certain case: a file that exists but cannot be run is left to the
    launcher, which names the real error.
    """
    if "/" in name:
        return not os.path.lexists(name)
    return not any(os.path.lexists(os.path.join(d or ".", name)) for d in path.split(os.pathsep))


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in a process group, read from /proc."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it exited while we looked: not a member any more
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":
            members.append(int(entry.name))
    return members


def process_table() -> dict[int, tuple[int, str, int, int]]:
    """Every process, by pid: (parent pid, state letter, session id, process group),
    read from /proc."""
    return process_table_until(None)[0]


def process_table_until(
    cut: Callable[[], bool] | None,
) -> tuple[dict[int, tuple[int, str, int, int]], bool]:
    """process_table, and whether it is whole: the look stops early once `cut()` says
    so (asked every 256 entries). Under a fork storm one look at /proc can take
    seconds (each stat read contends with the forks), and a deadline must hold."""
    table: dict[int, tuple[int, str, int, int]] = {}
    for n, entry in enumerate(os.scandir("/proc")):
        if cut is not None and n % 256 == 255 and cut():
            return table, False
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it exited (and was reaped) while we looked
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(b")") + 2 :].split()
        table[int(entry.name)] = (
            int(fields[1]), fields[0].decode(), int(fields[3]), int(fields[2])
        )  # fmt: skip
    return table, True


def children_of(ppid: int) -> dict[int, tuple[str, int]]:
    """Our children by pid, each with its state letter and session id, read from /proc.

    With the supervisor a child subreaper (docket.run.hardening), this includes
    every process the agent detached whose parent has gone.
    """
    return {
        pid: (state, sid)
        for pid, (parent, state, sid, _) in process_table().items()
        if parent == ppid
    }


def cmdline_of(pid: int) -> list[str]:
    """A process's argv as /proc shows it ([] for a zombie, or one that is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]]


def reap_now(pid: int) -> int | None:
    """Reap a child that has exited (a zombie): its returncode, or None if it was not
    ours to reap or has not exited."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if got else None


REAP_AT_ONCE = 4096  # exited children reaped in one go, before the caller looks again


def reap_exited(ours: Callable[[int], bool]) -> tuple[list[tuple[int, int]], bool]:
    """Reap, in the kernel's order, every child that has exited and is `ours`, without a
    look at /proc: ([(pid, returncode)], whether none is left waiting). The kernel shows
    only the first exited child (waitid with WNOWAIT), so the first that is not ours (the
    agent, a harness's own child) stops the drain: the caller looks at /proc for the rest.

    Why: a fork bomb that churns (each member forks its replacement and exits) hands the
    supervisor, a child subreaper, thousands of zombies a second; a look at /proc walks
    every one of them, slower than they come, and never finishes."""
    reaped: list[tuple[int, int]] = []
    for _ in range(REAP_AT_ONCE):
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped, True  # no children at all
        if info is None:
            return reaped, True  # none has exited
        if not ours(info.si_pid):
            return reaped, False
        returncode = reap_now(info.si_pid)
        if returncode is None:
            return reaped, False  # reaped by another meanwhile: look again later
        reaped.append((info.si_pid, returncode))
    return reaped, False


async def reap_pid(pid: int, timeout: float) -> int | None:
    """Wait (at most `timeout` s) for a child that is not a Popen's to exit, and reap
    it: its returncode (-N for signal N), or None if it did not exit in time or
    was not ours to reap."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return None  # gone already: reaped by someone else
    except (AttributeError, OSError):
        pidfd = None  # no pidfd (Linux < 5.3): poll it instead
    with trio.move_on_after(timeout):
        if pidfd is not None:
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        while True:
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return None  # not ours, or reaped meanwhile
            if got:
                return os.waitstatus_to_exitcode(status)
            await trio.sleep(0.01)  # only without pidfd, or a pidfd readable early
    return None


class Child:
    """The spawned agent: its pid (also its process group's id) and its exit.

    One task owns it and calls `reap`; any other task waits on `exited`.
    The pid cannot be reused until `reap` has run, so signalling the group
    before then always reaches the right processes.
    """

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.returncode: int | None = None
        self.exited = trio.Event()

    async def reap(self) -> int:
        try:
            pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            pidfd = None  # no pidfd (Linux < 5.3): a worker thread waits instead
        if pidfd is None:
            await trio.to_thread.run_sync(_wait_no_reap, self.pid, abandon_on_cancel=True)
        else:
            try:
                await trio.lowlevel.wait_readable(pidfd)
            finally:
                os.close(pidfd)
        self.returncode = self.popen.wait()  # it has exited: this only reaps
        self.exited.set()
        return self.returncode

    def kill_now(self) -> None:
        """For a run leaving abnormally: SIGKILL the group and reap, blocking briefly."""
        if self.returncode is None:
            if self.popen.poll() is None:
                # Cannot miss: an unreaped leader stays in its group, even as a zombie.
                os.killpg(self.pid, signal.SIGKILL)
            self.returncode = self.popen.wait()
            self.exited.set()


def _wait_no_reap(pid: int) -> None:
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
