"""How the end of a run's processes proceeds, and when it stops: decisions on facts, no I/O.

Nothing of a run may outlive it, whatever its fork rate (docket.run.orphans does
the I/O). Three ways, the first the machine allows:

- `cgroup`: the run's leaf (docket.run.cgroup) holds every process of the run.
  Freeze it (so its member list holds still for the record), kill it
  (`cgroup.kill`), until it is empty (`populated 0`). `cgroup_step` decides.
- `pid_namespace`: the run's own PID namespace (docket.run.pid_namespace): its
  members are noted, its init is killed, and the kernel ends every other member
  before the init is reaped.
- `signals`: the freeze-then-kill loop over the run's process tree (the
  supervisor is a child subreaper, so whatever the agent detaches comes back
  under it, `run_tree`). SIGSTOP every member not stopped yet (a stopped
  process cannot fork) and look again, until a look finds every member
  stopped; then SIGKILL them all, and look again. `next_step` decides.

The loop always runs last (for what left the leaf, or the namespace's own end).
The end is over when nothing of the run is alive, or at the deadline: what is
alive then are survivors, and the run says its isolation failed
(docket.run.orphans records them; the run exits 43, as for any evidence lost).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from docket.errors import InputError

CGROUP, PIDNS, SIGNALS = "cgroup", "pid_namespace", "signals"
WAYS = (CGROUP, PIDNS, SIGNALS)  # strongest first
# The first way to try (the ones before it are skipped): for an agent a user
# namespace breaks (it needs sudo), or a test of a weaker way where a stronger one works.
ISOLATION_ENV = "DOCKET_ISOLATION"
DEAD = frozenset("ZX")  # /proc state letters of a process that has exited
STOPPED = frozenset("Tt")  # stopped by a signal, or by a tracer: it cannot fork


def first_way(value: str) -> str:
    """The way named by DOCKET_ISOLATION (empty: the strongest)."""
    if value == "":
        return CGROUP
    if value not in WAYS:
        raise InputError(f"{ISOLATION_ENV}={value[:40]!r}: expected one of {', '.join(WAYS)}")
    return value


def mechanism(cgroup_error: str | None, namespace_error: str | None) -> str:
    """The way the run's processes will be ended: its cgroup leaf when one was made,
    else its PID namespace unless that cannot work here, else signals."""
    if cgroup_error is None:
        return CGROUP
    return PIDNS if namespace_error is None else SIGNALS


Action = Literal["done", "signal", "freeze", "wait", "kill", "give_up"]


@dataclass(frozen=True)
class Step:
    """What to do next. The tree loop: `signal` (SIGSTOP `stop`, SIGKILL `kill`).
    The cgroup leaf: `freeze` it, `wait` for the freezer, `kill` it. Both: `wait`
    (look again), `done`, or `give_up` with `survivors` (the deadline passed; the
    leaf's are read from it)."""

    action: Action
    stop: frozenset[int] = frozenset()
    kill: frozenset[int] = frozenset()
    survivors: frozenset[int] = frozenset()


def next_step(
    members: Mapping[int, str], stop_sent: frozenset[int], now: float, deadline: float
) -> Step:
    """The freeze-then-kill loop's next step.

    `members`: each process of the run found by the last look, with its /proc state
    letter. `stop_sent`: those already sent SIGSTOP (one in uninterruptible sleep,
    `D`, stops on its way back to user space, where it would fork: it counts as
    stopped once told).

    Every member not stopped is stopped, and only once a look finds them all
    stopped are they killed, all at once: a fork bomb held at its process limit
    (RLIMIT_NPROC) gets no slot back to fork into while any of it still runs. But
    a member that was stopped and shows running again was woken (SIGCONT) by
    another, and stopping is being undone: then every member is killed at each
    look, so two that wake each other cannot keep the loop from ever finding them
    all stopped. A bomb that forks and wakes as fast as it can may still outrun a
    loop over /proc until the deadline: that is why the run's cgroup comes first.
    """
    if not members:
        return Step("done")
    live = frozenset(pid for pid, state in members.items() if state not in DEAD)
    if not live:
        # Only the dead, but not yet gone: a look at /proc is not atomic, and the child a
        # process forked as it exited may have been missed. Once its parent is a zombie it
        # is ours, so a look after the zombies are reaped, finding none, is the proof.
        return Step("done" if now >= deadline else "wait")
    if now >= deadline:
        return Step("give_up", survivors=live)
    held = frozenset(
        pid for pid in live if members[pid] in STOPPED or (members[pid] == "D" and pid in stop_sent)
    )
    running = live - held
    if not running or running & stop_sent:
        return Step("signal", kill=live)
    return Step("signal", stop=running)


def cgroup_step(populated: bool, frozen: bool, froze_for: float | None, now: float,
                deadline: float, *, freeze_wait: float) -> Step:  # fmt: skip
    """The cgroup leaf's next step.

    `froze_for`: seconds since the freeze was asked for (None: not yet asked).
    Freezing is for the record only (a member list that holds still): when the
    freezer does not finish within `freeze_wait` (a member in uninterruptible
    sleep), the leaf is killed all the same, and `cgroup.kill` reaches every
    member however fast it forks.
    """
    if not populated:
        return Step("done")
    if now >= deadline:
        return Step("give_up")  # who is left: read from the leaf
    if froze_for is None:
        return Step("freeze")
    if not frozen and froze_for < freeze_wait:
        return Step("wait")
    return Step("kill")


# A process as /proc shows it: (parent pid, state letter, session id, process group).
Proc = tuple[int, str, int, int]


def run_tree(
    table: Mapping[int, Proc], supervisor: int, session: int, excluded: frozenset[int]
) -> dict[int, str]:
    """The run's processes, each with its state letter: the supervisor's children
    outside its own session and not in `excluded` (its children from before the
    spawn), and every descendant of theirs. With the supervisor a child subreaper,
    a process the agent detached is one of them once its parent has gone."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    roots = [
        pid
        for pid in children.get(supervisor, [])
        if pid not in excluded and table[pid][2] != session
    ]
    found: dict[int, str] = {}
    while roots:  # iterative: a chain of any depth
        pid = roots.pop()
        if pid in found:
            continue
        found[pid] = table[pid][1]
        roots.extend(children.get(pid, []))
    return found


def groups_of(pids: frozenset[int], table: Mapping[int, Proc], session: int) -> frozenset[int]:
    """The process groups of `pids`, outside the supervisor's session. A signal to a
    whole group reaches a child being forked meanwhile (the kernel restarts a fork
    that a group signal races), so a process that replaces itself with a fork in its
    group cannot slip between a look and a signal. A run's groups hold only the run's
    processes: a group is joined only within its session, and the run's sessions are
    made by the run's processes (the agent's by docket, for it)."""
    return frozenset(table[pid][3] for pid in pids if pid in table and table[pid][2] != session)
