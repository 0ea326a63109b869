"""The supervised child's first instant: bind its life to the supervisor's, then exec.

`python -m docket.run.launch SUPERVISOR_PID -- CMD ...` asks the kernel to SIGKILL
this process when its parent dies (PR_SET_PDEATHSIG), checks the parent did not
die before that request took effect, and execs CMD in place (the pid, the
process group and the death signal carry over). Doing this here rather than in
a subprocess preexec_fn keeps fork free of Python code while the supervisor has
threads (the ledger's writer), which the subprocess docs warn can deadlock.

The kernel sends the death signal when the *thread* that forked this process
ends, not the whole supervisor: the supervisor must spawn from a thread that
lives as long as the run (its main thread), never from a worker pool.

The death signal is per process: it takes the agent, not what the agent
started. So before the exec a small watcher is left behind (`keep_group`):
when the supervisor dies, it SIGKILLs the agent's process group, and with it
every process the agent started there.

`--cgroup DIR` names the run's cgroup v2 leaf (docket.run.cgroup): the launcher
moves itself into it first, so the watcher, the agent and all the agent starts
are born inside it (and with the leaf named, the watcher kills the whole leaf
when the supervisor dies, not the group only).

`--pid-namespace` asks for the run's own PID namespace (docket.run.pid_namespace),
where there is no cgroup: the launcher stays as the agent's stand-in, and the
namespace's init takes the watcher's place. Where the kernel refuses the namespace,
the launcher goes on as without it and says why on the report pipe.

`python -m docket.run.launch PID --report-fd N -- CMD ...` also writes the
watcher's pid (a line) to file descriptor N, then closes it before the exec: the
supervisor, a child subreaper, gets the watcher back as an orphan like any
process the agent detaches, and must tell it from those (it is docket's own, not
the agent's, so it is ended but not recorded as the agent's orphan).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys

from docket.run import pid_namespace

PR_SET_PDEATHSIG = 1
EXIT_CANNOT_EXEC = 126
EXIT_NOT_FOUND = 127

# Python ignores these at start-up and exec keeps an ignored signal ignored: an
# agent must start with them at their defaults, as subprocess's restore_signals does.
RESTORED_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)


def restore_default_signals() -> None:
    # Only these: a signal our caller ignored on purpose (SIGINT for a background
    # job) stays ignored, and exec resets every handled one to its default anyway.
    for sig in RESTORED_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


# After the agent ends, how long the watcher waits to see whether the supervisor
# ended too: the agent's death signal can reach it before the supervisor's exit does.
SUPERVISOR_SETTLE_MS = 200


def keep_group(supervisor: int, report_fd: int | None = None, cgroup: str | None = None) -> None:
    """Leave a watcher that SIGKILLs this process's group if the supervisor dies,
    and the whole run's cgroup leaf with it when there is one (`cgroup`: what the
    agent detached from the group too).

    It watches two pidfds, the supervisor's and this process's (the agent's, once
    exec'd), and ends with the agent. It is not in the group (a session of its own:
    the supervisor's signals to the group, and its count of stragglers, never see
    it) and not the agent's child (a double fork: an agent's `wait` for its children
    never waits for it). Without pidfds (Linux before 5.3) there is no watcher, and
    the agent's own death signal is all there is (ADR 0004).
    """
    try:
        supervisor_fd = os.pidfd_open(supervisor)
        agent_fd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        return
    if os.getppid() != supervisor:
        return  # the supervisor is already gone: the death signal armed in main() ends us
    group = os.getpgrp()
    first = os.fork()
    if first == 0:
        try:
            watcher = os.fork()
            if watcher == 0:
                if report_fd is not None:
                    os.close(report_fd)  # the supervisor reads to the end of the line only
                _watch(group, supervisor_fd, agent_fd, cgroup)
            if report_fd is not None:
                os.write(report_fd, f"{watcher}\n".encode())
        finally:
            os._exit(0)
    os.waitpid(first, 0)
    os.close(supervisor_fd)
    os.close(agent_fd)


def _watch(group: int, supervisor_fd: int, agent_fd: int, cgroup: str | None) -> None:
    """The watcher's life (never returns): see keep_group."""
    try:
        os.setsid()
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # the agent's output is not ours to hold open
            os.dup2(quiet, fd)
        watched = select.poll()
        watched.register(supervisor_fd, select.POLLIN)
        watched.register(agent_fd, select.POLLIN)
        ready = {fd for fd, _ in watched.poll()}
        if supervisor_fd not in ready:  # the agent ended: did its supervisor?
            settle = select.poll()
            settle.register(supervisor_fd, select.POLLIN)
            ready = {fd for fd, _ in settle.poll(SUPERVISOR_SETTLE_MS)}
        if supervisor_fd in ready:
            # The group's id stays taken while any member lives, so this reaches
            # only what is left of the agent's.
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                if cgroup is None:
                    return  # nothing of the agent's is left: nothing to stop
            if cgroup is not None:
                # Every process of the run, this watcher last (it is in the leaf too).
                fd = os.open(os.path.join(cgroup, "cgroup.kill"), os.O_WRONLY)
                os.write(fd, b"1")
    finally:
        os._exit(0)


USAGE = (
    "usage: python -m docket.run.launch PID [--report-fd N] [--cgroup DIR] [--pid-namespace]"
    " -- CMD ..."
)


def join_cgroup(leaf: str) -> str | None:
    """Move this process into the run's cgroup leaf (docket.run.cgroup): None, or why not."""
    try:
        fd = os.open(os.path.join(leaf, "cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)
    except OSError as exc:
        return f"cannot join the run's cgroup {leaf}: {exc.strerror or exc}"
    return None


def main(argv: list[str]) -> int:
    report_fd = cgroup = None
    namespace = False
    if argv[:1] and argv[0].isdigit():
        while len(argv) > 2 and argv[1] in ("--report-fd", "--cgroup", "--pid-namespace"):
            if argv[1] == "--pid-namespace":
                namespace, argv = True, argv[:1] + argv[2:]
                continue
            if argv[1] == "--report-fd" and argv[2].isdigit():
                report_fd = int(argv[2])
            elif argv[1] == "--cgroup" and argv[2]:
                cgroup = argv[2]
            else:
                break
            argv = argv[:1] + argv[3:]
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print(f"docket launch: {USAGE}", file=sys.stderr)
        return 2
    supervisor, command = int(argv[0]), argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        print(f"docket launch: prctl failed: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return EXIT_CANNOT_EXEC
    if cgroup is not None:
        # Before anything is forked: the watcher and the agent are born inside, and
        # all they start. An agent outside the leaf the run counts on is not started.
        why = join_cgroup(cgroup)
        if why is not None:
            print(f"docket launch: {why}; not starting", file=sys.stderr)
            return EXIT_CANNOT_EXEC
    if os.getppid() != supervisor:
        # The supervisor died before the death signal was armed: do not run orphaned.
        print(f"docket launch: supervisor {supervisor} is gone; not starting", file=sys.stderr)
        return EXIT_CANNOT_EXEC
    if namespace and report_fd is not None:
        why = in_pid_namespace(supervisor, report_fd, command)  # returns only if refused
        if why is not None:
            print(f"docket launch: {why}; not starting", file=sys.stderr)
            return EXIT_CANNOT_EXEC
    keep_group(supervisor, report_fd, cgroup)
    if report_fd is not None:
        os.close(report_fd)  # not the agent's: it ends here, before the exec
    return exec_agent(command)


def in_pid_namespace(supervisor: int, report_fd: int, command: list[str]) -> str | None:
    """The run in its own PID namespace (docket.run.pid_namespace): never returns if
    made. If the kernel refuses it, the refusal goes on the report pipe (the watcher's
    pid follows it) and this returns None; a refusal that left this process half
    changed is returned, and the launcher does not start the agent."""
    why: str | None
    try:
        supervisor_fd = os.pidfd_open(supervisor)
    except (AttributeError, OSError) as exc:
        why, changed = f"no pidfd for the supervisor: {exc}", False
    else:
        why, changed = pid_namespace.enter()
        if why is None:
            pid_namespace.run(supervisor_fd, report_fd, lambda: exec_agent(command))
        os.close(supervisor_fd)
    if changed:
        return why
    os.write(report_fd, f"refused {why}\n".encode())
    return None


def exec_agent(command: list[str]) -> int:
    """Exec the agent's command in this process: returns only the exit code of a failure."""
    restore_default_signals()
    try:
        os.execvp(command[0], command)
    except FileNotFoundError:
        print(f"docket: command not found: {command[0]}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except OSError as exc:
        print(f"docket: cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return EXIT_CANNOT_EXEC
    except ValueError as exc:  # an empty name, a NUL byte: exec cannot take it
        print(f"docket: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return EXIT_CANNOT_EXEC
    return EXIT_CANNOT_EXEC  # not reached: exec replaced this process


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
