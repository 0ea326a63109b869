"""The processes the agent detached: back to the supervisor, ended with the run, recorded.

An agent that starts a process with setsid (or a double fork) puts it out of
reach of its process group, so killing the group at the end of the run missed
it and it outlived the run. The supervisor is a child subreaper for the run
(docket.run.hardening): when such a process's parent dies, the kernel hands it
to the supervisor instead of init. Once the agent is reaped, every process it
left is the supervisor's child or a descendant of one, in a session of its own
(the agent's, or one it made), never the supervisor's. `OrphanSweep` finds
them, SIGKILLs and reaps them, round after round (a process killed hands its
own children over in turn), and records each as `process.orphan`: pid, argv
(redacted), whether it was still running, and how it ended.

Docket's own watcher (docket.run.launch.keep_group) comes back the same way; the
launcher reports its pid on a pipe, and it is ended without being recorded as
the agent's. Processes of the supervisor's own session (a harness running the
supervisor in its process may have children of its own) and those that were
its children before the spawn are never touched.

While the agent runs, an orphan that exits is reaped on SIGCHLD and recorded
(`found: exited`), so none piles up as a zombie in a long run.

`OrphanSweep` is an object of its own, held by docket.run.control.ChildControl;
its one collaborator is `record`, the supervisor's way to append an event.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable

import trio

from docket.guards.redact import redact_argv
from docket.run.child import Child, children_of, cmdline_of, describe_exit, reap_now, reap_pid

MAX_ORPHAN_EVENTS = 16  # each listed; past this one event counts the rest (the ledger's
# control reserve is for the end of the record, not for an agent's thousand daemons)
MAX_ROUNDS = 64  # a tree deeper than this (or forking as fast as it is killed) is left
REAP_SECONDS = 5.0  # for a round's SIGKILLed processes to be gone
ARGV_ITEMS, ARGV_CHARS = 8, 200  # an orphan's argv, as recorded


# How an event reaches the ledger: the supervisor's append (redacted; a full ledger
# or lost evidence stops the run instead of raising), the seq or None.
Record = Callable[..., Awaitable[int | None]]


class OrphanSweep:
    """Find, end, reap and record what the agent left behind."""

    def __init__(self, record: Record) -> None:
        self._record = record
        self._children_before: frozenset[int] = frozenset()
        self._orphans_listed = 0
        self._orphans_unlisted = 0
        self._report_fd: int | None = None  # the launcher's pipe: the watcher's pid
        self._watcher: int | None = None  # the pid read from it

    def note_children(self) -> None:
        """Before the spawn: the children this process has already, never ours to end."""
        self._children_before = frozenset(children_of(os.getpid()))

    def open_report_pipe(self) -> int:
        """Before the spawn: the pipe the launcher reports its watcher on; the write end."""
        self._report_fd, report = os.pipe()
        os.set_blocking(self._report_fd, False)
        self._watcher = None
        return report

    def _watcher_pid(self) -> int | None:
        """The watcher's pid, as the launcher wrote it (one write, before its exec).
        Read without blocking: if it is not there yet, ask again later."""
        fd = self._report_fd
        if fd is not None:
            try:
                data = os.read(fd, 64)
            except BlockingIOError:
                return None  # the launcher has not written it yet
            self.close_report_fd()
            text = data.decode("ascii", "replace").strip()
            self._watcher = int(text) if text.isdigit() else None
        return self._watcher

    def close_report_fd(self) -> None:
        fd, self._report_fd = self._report_fd, None
        if fd is not None:
            os.close(fd)

    def _orphans(self, agent: int) -> dict[int, str]:
        me, session = os.getpid(), os.getsid(0)
        return {
            pid: state
            for pid, (state, sid) in children_of(me).items()
            if pid != agent and pid not in self._children_before and sid != session
        }

    async def reap_while_running(self, child: Child) -> None:
        """While the agent runs, an orphan that exits is reaped at once (SIGCHLD) and
        recorded: a long run whose agent daemonizes short-lived tools leaves no
        zombies piling up. Stops when the agent has exited: the sweep takes over."""
        with trio.open_signal_receiver(signal.SIGCHLD) as sigchld:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_when_set, child.exited, nursery.cancel_scope)
                async for _ in sigchld:
                    await self._reap_exited(child)

    async def _reap_exited(self, child: Child) -> None:
        for pid, state in self._orphans(child.pid).items():
            # No await between the check and the reap: the sweep, once the agent has
            # exited, never finds a pid half taken by this task.
            if state != "Z" or child.exited.is_set():
                continue
            returncode = reap_now(pid)
            if returncode is None or pid == self._watcher_pid():
                continue
            await self._record_orphan(pid, [], "exited", returncode)

    async def _record_orphan(
        self, pid: int, argv: list[str], found: str, returncode: int | None
    ) -> None:
        if self._orphans_listed >= MAX_ORPHAN_EVENTS:
            self._orphans_unlisted += 1
            return
        self._orphans_listed += 1
        reason = (
            describe_exit(returncode)
            if returncode is not None
            else f"not reaped within {REAP_SECONDS:g} s of SIGKILL"
        )
        await self._record(
            "process.orphan",
            pid=pid,
            argv=[a[:ARGV_CHARS] for a in redact_argv(argv)[:ARGV_ITEMS]],
            found=found,
            status=returncode,
            reason=reason,
        )

    async def end_orphans(self, agent: int) -> None:
        watcher = self._watcher_pid()
        tried: set[int] = set()  # one that would not die is recorded once, not waited on again
        for _ in range(MAX_ROUNDS):
            found = {pid: s for pid, s in self._orphans(agent).items() if pid not in tried}
            if not found:
                break
            tried.update(found)
            argvs = {pid: cmdline_of(pid) for pid in found}  # before the kill empties it
            for pid, state in found.items():
                if state != "Z":
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        continue  # it exited meanwhile: reaped below all the same
            deadline = trio.current_time() + REAP_SECONDS  # for the round: they die together
            for pid, state in found.items():
                returncode = await reap_pid(pid, max(deadline - trio.current_time(), 0))
                if pid == watcher:
                    continue  # docket's own, not the agent's
                found_as = "exited" if state == "Z" else "running"
                await self._record_orphan(pid, argvs[pid], found_as, returncode)
        unlisted = self._orphans_unlisted
        if unlisted:
            await self._record(
                "process.orphan",
                unlisted=unlisted,
                reason=f"{unlisted} more orphan(s) ended and reaped, not listed one by one",
            )


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
