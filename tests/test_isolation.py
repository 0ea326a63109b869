"""The decisions that end a run's processes (docket/run/isolation.py) and the reading of
the cgroup files (docket/run/cgroup.py): pure functions on facts, property-tested.

The loop is also run against a model of processes that fork between looks, as fast
as hypothesis likes: it ends with nothing alive, never kills while a member can
still fork unseen, and gives up only at its deadline.
"""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from docket.run.cgroup import cgroup2_mount, events_say, own_cgroup
from docket.run.child import process_table_until
from docket.run.isolation import (
    CGROUP,
    PIDNS,
    SIGNALS,
    Step,
    cgroup_step,
    groups_of,
    mechanism,
    next_step,
    run_tree,
)

STATES = st.sampled_from("RSDTtZX")


def test_the_mechanism_is_the_first_the_machine_allows():
    assert mechanism(None, None) == CGROUP
    assert mechanism(None, "user namespaces are off") == CGROUP
    assert mechanism("no cgroup2 hierarchy is mounted", None) == PIDNS
    assert mechanism("no cgroup2 hierarchy is mounted", "DOCKET_ISOLATION=signals") == SIGNALS


def stop(*pids: int) -> Step:
    return Step("signal", stop=frozenset(pids))


def kill(*pids: int) -> Step:
    return Step("signal", kill=frozenset(pids))


def test_next_step_freezes_the_running_then_kills_when_all_are_stopped():
    assert next_step({}, frozenset(), 0.0, 5.0) == Step("done")
    # Only the dead: a look is not atomic, so once more after they are reaped.
    assert next_step({7: "Z"}, frozenset(), 0.0, 5.0) == Step("wait")
    assert next_step({7: "Z"}, frozenset(), 5.0, 5.0) == Step("done")
    assert next_step({7: "R", 8: "T"}, frozenset(), 0.0, 5.0) == stop(7)
    assert next_step({7: "T", 8: "t", 9: "Z"}, frozenset(), 0.0, 5.0) == kill(7, 8)
    # Uninterruptible sleep: stopped once told (it stops on its way out of the kernel).
    assert next_step({7: "D"}, frozenset(), 0.0, 5.0) == stop(7)
    assert next_step({7: "D"}, frozenset({7}), 0.0, 5.0) == kill(7)
    # Woken by SIGCONT after its stop: stopping is being undone, so all are killed now.
    assert next_step({7: "S", 8: "T", 9: "R"}, frozenset({7, 8}), 0.0, 5.0) == kill(7, 8, 9)
    assert next_step({7: "R", 8: "Z"}, frozenset(), 5.0, 5.0) == Step(
        "give_up", survivors=frozenset({7})
    )


@given(st.dictionaries(st.integers(1, 99), STATES), st.frozensets(st.integers(1, 99)),
       st.floats(0, 10), st.floats(0, 10))  # fmt: skip
def test_next_step_properties(members, stop_sent, now, deadline):
    step = next_step(members, stop_sent, now, deadline)
    live = {p for p, s in members.items() if s not in "ZX"}
    if not members:
        assert step == Step("done")
        return
    if not live:
        assert step == Step("done" if now >= deadline else "wait")
        return
    if now >= deadline:
        assert step == Step("give_up", survivors=frozenset(live))
        return
    assert step.action == "signal"
    held = {p for p in live if members[p] in "Tt" or (members[p] == "D" and p in stop_sent)}
    woken = (live - held) & stop_sent
    if held == live or woken:
        assert step == Step("signal", kill=frozenset(live))  # all at once
    else:
        assert step == Step("signal", stop=frozenset(live - held))  # nothing killed yet


def run_loop(procs: dict[int, str], act, looks: int) -> int:
    """The loop against a model world: after each look, every member the look saw
    running (and every one born since) acts once before its signal lands (`act`);
    then the signals land. The number of looks it took to end, or fails."""
    stop_sent: set[int] = set()
    for look in range(1, looks + 1):
        step = next_step(dict(procs), frozenset(stop_sent), float(look), 1e9)
        if step.action == "done":
            return look
        assert step.action in ("signal", "wait")
        act()
        for pid in step.kill:
            del procs[pid]
        for pid in step.stop:
            procs[pid] = "T"
        stop_sent |= step.stop
    raise AssertionError(f"{len(procs)} left after {looks} looks")


@given(st.integers(1, 300), st.integers(1, 3))
def test_the_loop_outlasts_a_fork_bomb_at_its_limit(limit, forks):
    """Every running member forks `forks` times after each look, up to the bomb's
    process limit (RLIMIT_NPROC, or a count): stopped, they hold their slots, and
    the loop ends once the limit is reached."""
    procs, born = {1: "R"}, [1]

    def act():
        for state in list(procs.values()):
            for _ in range(forks if state in "RS" else 0):
                if len(procs) < limit:
                    born[0] += 1
                    procs[born[0]] = "R"

    assert run_loop(procs, act, limit + 3) <= limit + 3


@given(st.integers(2, 50), st.randoms(use_true_random=False))
def test_the_loop_ends_members_that_wake_each_other(count, chance):
    """Members that SIGCONT stopped ones after each look (the ping-pong that keeps a
    loop from ever seeing them all stopped): ended within three looks."""
    procs = dict.fromkeys(range(1, count + 1), "R")

    def act():
        runners = [p for p, s in procs.items() if s in "RS"]
        stopped = [p for p, s in procs.items() if s == "T"]
        for _ in runners:
            if stopped:
                procs[chance.choice(stopped)] = "S"

    assert run_loop(procs, act, 3) <= 3


def test_cgroup_step_freezes_waits_then_kills_until_empty():
    assert cgroup_step(False, False, None, 0.0, 5.0, freeze_wait=0.5) == Step("done")
    assert cgroup_step(True, False, None, 0.0, 5.0, freeze_wait=0.5) == Step("freeze")
    assert cgroup_step(True, False, 0.1, 0.1, 5.0, freeze_wait=0.5) == Step("wait")
    assert cgroup_step(True, True, 0.1, 0.1, 5.0, freeze_wait=0.5) == Step("kill")
    # A freezer that does not finish (a member in uninterruptible sleep): killed anyway.
    assert cgroup_step(True, False, 0.5, 0.5, 5.0, freeze_wait=0.5) == Step("kill")
    assert cgroup_step(True, True, 4.0, 5.0, 5.0, freeze_wait=0.5) == Step("give_up")


def test_run_tree_is_the_supervisors_other_session_children_and_all_below():
    me, session = 100, 100
    table = {
        100: (1, "S", 100, 100),
        101: (100, "S", 100, 100),  # a child in the supervisor's own session: the harness's
        102: (100, "S", 102, 102),  # a child from before the spawn
        103: (100, "R", 103, 103),  # the agent's orphan...
        104: (103, "T", 103, 104),  # ...its child, in a group of its own
        105: (104, "Z", 105, 105),  # ...and grandchild, a zombie in a session of its own
        106: (101, "R", 100, 100),  # the harness's grandchild
        107: (1, "R", 103, 103),  # gone to init: out of reach, not ours
    }
    tree = run_tree(table, me, session, frozenset({102}))
    assert tree == {103: "R", 104: "T", 105: "Z"}
    # Signalled by group too, never the supervisor's session's.
    assert groups_of(frozenset(tree) | {101, 999}, table, session) == {103, 104, 105}


def test_run_tree_walks_a_chain_of_any_depth():
    table = {n: (n - 1, "S", n, n) for n in range(2, 20_002)}
    assert len(run_tree(table, 1, 1, frozenset())) == 20_000


def test_cgroup_files_are_read_as_the_kernel_writes_them():
    mountinfo = (
        "25 1 0:23 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        "35 25 0:30 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        "36 25 0:31 / /sys/fs/cgroup/uni\\040fied rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
    )
    assert cgroup2_mount(mountinfo) == "/sys/fs/cgroup/uni fied"
    assert cgroup2_mount("35 25 0:30 / /x rw - cgroup cgroup rw\n") is None
    assert own_cgroup("9:name=systemd:/\n4:memory:/a/b\n0::/\n") == "/"
    assert own_cgroup("0::/user.slice/docket-x\n") == "/user.slice/docket-x"
    assert own_cgroup("4:memory:/a\n") is None
    assert events_say("populated 1\nfrozen 0\n", "populated")
    assert not events_say("populated 0\nfrozen 1\n", "populated")
    assert events_say("populated 0\nfrozen 1\n", "frozen")


def test_a_look_at_proc_is_whole_or_says_it_was_cut():
    table, whole = process_table_until(None)
    assert whole and os.getpid() in table
    assert table[os.getpid()][0] == os.getppid()
    cut, whole = process_table_until(lambda: True)  # told to stop at once
    if len(os.listdir("/proc")) >= 256:  # asked every 256 entries
        assert not whole and len(cut) < 256
