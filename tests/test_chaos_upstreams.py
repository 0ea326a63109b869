"""`@t` net windows (chaos.run.upstreams.hold_window) against a real fault proxy: lifted
at their end or when cancelled, and a proxy that fails is recorded, never fatal."""

from __future__ import annotations

import socket
from functools import partial

import trio

from chaos.faults.schedule import FaultSchedule
from chaos.run.evidence import FaultEvidence
from chaos.run.upstreams import Upstreams, hold_window
from chaos.toxiproxy import serve_toxiproxy
from chaos.toxiproxy.driver import ToxiproxyDriver

DEADLINE = 10


class Handle:
    """The part of docket.run.hooks.RunHandle the evidence uses: records, in order."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    async def record_fault(self, fields) -> int:
        self.records.append(dict(fields))
        return len(self.records) - 1


def window_run(text: str, tmp_path, url: str):
    schedule = FaultSchedule.parse(5, [text])
    upstreams = Upstreams(driver=ToxiproxyDriver(url), embedded=False)
    evidence = FaultEvidence(tmp_path / "injected.jsonl")
    handle = Handle()
    evidence.open(handle)
    window = (0, schedule.faults[0], "docket_openai")
    run = partial(
        hold_window,
        upstreams,
        window,
        schedule=schedule,
        run_started=trio.current_time(),
        evidence=evidence,
    )
    return run, handle, upstreams.driver


async def test_a_window_cancelled_inside_it_is_lifted_and_says_teardown(tmp_path):
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve_toxiproxy, port=0))
            run, handle, driver = window_run("net:latency(1s)@t 0..20s", tmp_path, server.url)
            await trio.to_thread.run_sync(driver.create_proxy, "docket_openai", "127.0.0.1:9")
            async with trio.open_nursery() as windows:
                windows.start_soon(run)
                while not await trio.to_thread.run_sync(driver.toxics, "docket_openai"):
                    await trio.sleep(0.01)
                windows.cancel_scope.cancel()
            left = await trio.to_thread.run_sync(driver.toxics, "docket_openai")
            nursery.cancel_scope.cancel()
    assert left == {}
    added, removed = handle.records
    assert added["action"] == "toxic_added" and added["at_s"] == 0.0
    assert removed["action"] == "toxic_removed" and removed["teardown"] is True
    assert 0 <= removed["at_s"] < 20 and "error" not in removed


async def test_a_proxy_that_fails_mid_run_is_recorded_and_the_run_goes_on(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        gone = s.getsockname()[1]  # nothing listens there once closed
    run, handle, _ = window_run("net:timeout(0)@t 0..5s", tmp_path, f"http://127.0.0.1:{gone}")
    with trio.fail_after(DEADLINE):
        await run()  # returns: the fault was not performed, and that is on record
    added, failed = handle.records
    assert added["action"] == "toxic_added"
    assert failed["action"] == "toxic_failed"
    assert "add toxic 'docket0_timeout' to 'docket_openai'" in failed["error"]
    assert "\n" not in failed["error"]
