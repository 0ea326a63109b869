"""Issue 11, part 5, the supervisor's share: a second Ctrl-C (or SIGTERM) kills at
once instead of waiting out --grace, and a process the agent detaches (setsid)
comes back to the supervisor (a child subreaper), is ended with the run and
recorded. Real `docket run` processes, real signals, every wait bounded."""

from __future__ import annotations

import signal
import sys
import textwrap
import time

import pytest
from helpers import read_events, running, wait_until
from test_supervisor import (
    READY,
    TIMEOUT,
    assert_verifies,
    assert_well_ended,
    kill_group,
    of_type,
    processes,  # noqa: F401 - the fixture
    start_docket,
)

STUBBORN = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    out = Path(sys.argv[1])
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    (out / "ready.tmp").write_text(str(os.getpid()))
    os.rename(out / "ready.tmp", out / "ready")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.05)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_kills_at_once_instead_of_waiting_out_the_grace(
    tmp_path,
    processes,  # noqa: F811 - the fixture
    capsys,
    sig,
):
    folder, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    grace = 300  # far longer than TIMEOUT: waiting it out fails the test
    supervisor = start_docket(
        processes,
        "run",
        "--ledger-dir",
        str(folder),
        "--grace",
        str(grace),
        "--",
        sys.executable,
        str(script),
        str(out),
        stderr_path=tmp_path / "stderr",
    )
    pid = int(
        wait_until(
            lambda: (out / "ready").exists() and (out / "ready").read_text(), READY, "the child"
        )
    )
    ledger = folder / "ledger.jsonl"
    name = signal.Signals(sig).name
    try:
        supervisor.send_signal(sig)
        wait_until(
            lambda: of_type(read_events(ledger), "signal.forwarded"), READY, "the first forward"
        )
        sent = time.monotonic()
        supervisor.send_signal(sig)
        assert supervisor.wait(timeout=TIMEOUT) == 128 + signal.SIGKILL
        took = time.monotonic() - sent
    finally:
        kill_group(pid)
    assert took < grace / 10
    events = read_events(ledger)
    first, kill = of_type(events, "signal.forwarded")
    assert (first["signal"], kill["signal"]) == (name, "SIGKILL")
    assert kill["reason"] == (
        f"{name} received by the supervisor again: killed without waiting out the grace period"
    )
    receipt = assert_well_ended(folder, events, 128 + signal.SIGKILL)
    assert (
        receipt["exit"]["reason"]
        == f"child killed by SIGKILL after {name}, {name} to the supervisor"
    )
    assert_verifies(folder, capsys)
