"""The run's PID namespace, where the machine gives no cgroup: when its init ends,
the kernel ends every other process of the run at once, whatever its fork rate.

Without a cgroup leaf (not root, no delegated cgroup2), the one other way to end a
run's processes is the freeze-then-kill loop over /proc (docket.run.orphans). A bomb
that churns outran it: 250 members, each forking its replacement every 5 ms, as
uid 65534, left survivors in 2 of 4 runs. A PID namespace needs no privilege where
user namespaces are allowed, and the kernel keeps its promise for it: no process
leaves its namespace, and when the namespace's first process (its init) ends, every
other process in it is killed, and its pids freed, before that init is a zombie.

    supervisor ── launcher L  (`python -m docket.run.launch`: the supervisor's child)
                    └─ init I  (pid 1 of the run's namespace; docket's own)
                         └─ agent  (pid 2: the command, exec'd)

- L makes the namespace (`enter`): a user namespace first unless root, mapping the
  user's own uid and gid to themselves (the agent is who it was, not root of
  anything), then the PID and mount namespaces; then it forks I (`run`).
- I mounts the namespace's own /proc over /proc (its mounts are slaves of the
  machine's: nothing it mounts is seen outside), so the agent's pids and /proc agree
  (psutil.Process() reads /proc/<getpid()>) and the agent sees no process outside
  the run (the next run's supervisor, say). Then it forks the agent, leaves the
  agent's process group (the supervisor's group signals are the agent's), and reaps
  the namespace's orphans until it is killed.
- I tells L the agent's wait status, and L exits with it (by the same signal, if
  the agent was killed by one): the supervisor reaps L as it would the agent. I
  outlives L: the sweep notes who is left, for the record, then SIGKILLs I, and the
  kernel ends the rest. If the supervisor dies first, I sees its pidfd and ends
  itself, and the run with it.

I reports its pid (the supervisor's numbering) on the launcher's report pipe, as
the watcher it replaces did: `PID pid_namespace [NOTE]`, NOTE saying what did not
hold (the machine's /proc kept).

What the agent sees differently: getpid() is small and getppid() is 1; a setuid
program (sudo) gains nothing inside a user namespace; groups it has no mapping for
show as 65534 (the kernel still checks files with the real ones).
`DOCKET_ISOLATION=signals` turns the namespace off, for an agent that needs those
(`DOCKET_ISOLATION=pid_namespace` skips the cgroup, to have the namespace anyway).
"""

from __future__ import annotations

import ctypes
import os
import resource
import select
import signal
from collections.abc import Callable
from typing import NoReturn

from docket.run.isolation import ISOLATION_ENV, PIDNS, SIGNALS

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_REC, MS_SLAVE = 0x4000, 0x80000
PR_SET_DUMPABLE = 4

# Ignored by L while it waits for the agent's status: the supervisor's group
# signals are for the agent, and L ended early would end I (and the run) with it.
IGNORED_BY_LAUNCHER = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
    signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGPIPE,
)  # fmt: skip


def unavailable(first: str) -> str | None:
    """Why the run cannot have a PID namespace here, or None: worth a try. `first`:
    the first way to try (docket.run.isolation.first_way). The launcher's try is the
    proof; this only saves one where it cannot work."""
    if first == SIGNALS:
        return f"{ISOLATION_ENV}={SIGNALS}"
    if os.geteuid() != 0:
        try:
            with open("/proc/sys/user/max_user_namespaces", "rb") as f:
                if int(f.read().strip() or b"0") == 0:
                    return "user namespaces are off (/proc/sys/user/max_user_namespaces is 0)"
        except (OSError, ValueError) as exc:
            return f"cannot read /proc/sys/user/max_user_namespaces: {exc}"
    return None


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _failed(what: str) -> str:
    return f"{what}: {os.strerror(ctypes.get_errno())}"


def enter() -> tuple[str | None, bool]:
    """Make this process's next children the first of a new PID (and mount)
    namespace: (None, _) or why not, and whether this process is changed anyway (a
    user namespace made, its map refused: it must not go on as if nothing happened)."""
    libc = _libc()
    uid, gid = os.geteuid(), os.getegid()
    if uid != 0:
        if libc.unshare(CLONE_NEWUSER) != 0:
            return _failed("unshare(CLONE_NEWUSER)"), False
        try:
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                               ("gid_map", f"{gid} {gid} 1")):  # fmt: skip
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        except OSError as exc:
            return f"cannot map uid {uid} into the run's user namespace: {exc}", True
    if libc.unshare(CLONE_NEWPID | CLONE_NEWNS) != 0:
        return _failed("unshare(CLONE_NEWPID|CLONE_NEWNS)"), uid != 0
    return None, uid != 0


def run(supervisor_fd: int, report_fd: int, start_agent: Callable[[], int]) -> NoReturn:
    """L's life once `enter` succeeded: fork I, report it, exit as the agent did."""
    status_read, status_write = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(status_read)
        os.close(report_fd)
        _init(supervisor_fd, status_write, start_agent)
    os.close(status_write)
    os.close(supervisor_fd)
    for sig in IGNORED_BY_LAUNCHER:
        signal.signal(sig, signal.SIG_IGN)
    with os.fdopen(status_read, "rb") as status:
        ready = status.readline().decode("ascii", "replace").split(" ", 1)
        note = ready[1].strip() if len(ready) > 1 else ""
        os.write(report_fd, f"{init} {PIDNS} {note}".strip().encode() + b"\n")
        os.close(report_fd)
        said = status.readline().split()
    if len(said) == 2 and said[0] == b"exit" and said[1].lstrip(b"-").isdigit():
        _exit_as(int(said[1]))
    os._exit(126)  # I ended before the agent did: killed from outside, with the run


def _exit_as(status: int) -> NoReturn:
    """Exit as the agent did: with its code, or killed by its signal (no core)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)  # a signal whose default is not to end: the shell's code
    os._exit(os.waitstatus_to_exitcode(status))


def _mount_proc() -> str:
    """The namespace's own /proc over the machine's: '' or what kept it from it."""
    libc = _libc()
    if libc.mount(b"none", b"/", None, MS_REC | MS_SLAVE, None) != 0:
        return _failed("proc kept: mount --make-rslave /")
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        return _failed("proc kept: mount proc /proc")
    return ""


def _init(supervisor_fd: int, status_fd: int, start_agent: Callable[[], int]) -> NoReturn:
    """I's life (pid 1 of the run's namespace): never returns. Its exit, however it
    comes, ends every process of the run."""
    try:
        os.write(status_fd, f"ready {_mount_proc()}\n".encode())
        agent = os.fork()
        if agent == 0:
            os.close(status_fd)
            os._exit(start_agent())
        # Python's SIGINT handler came with the fork: an agent's `kill -INT 1` would raise
        # in here and end the run. Ignored now (the agent, forked already, keeps its own).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.setpgid(0, 0)  # out of the agent's group: its signals are the agent's
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the agent's output is not ours to hold open
            os.dup2(quiet, fd)
        _libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # not the agent's to trace
        woken, wake = os.pipe()
        os.set_blocking(wake, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(wake)
        watched = select.poll()
        watched.register(woken, select.POLLIN)
        watched.register(supervisor_fd, select.POLLIN)
        while True:
            while True:  # reap what the namespace's orphans leave, the agent too
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break  # none left: wait for the end
                if pid == 0:
                    break
                if pid == agent:
                    try:
                        os.write(status_fd, f"exit {status}\n".encode())
                    except BrokenPipeError:
                        continue  # L is gone (killed with the agent's group): nobody to tell
            ready = {fd for fd, _ in watched.poll()}
            if supervisor_fd in ready:
                os._exit(0)  # the supervisor died: the run ends with it
            if woken in ready:
                os.read(woken, 4096)
    finally:
        os._exit(0)
