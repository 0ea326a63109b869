"""A shared Toxiproxy: each run's proxies are its own (`docket_TAG_PROVIDER`), runs going
at once do not collide, and a docket proxy that is not the run's is named in the
run's output and left where it is.

The embedded fault proxy serves the Toxiproxy API, so it stands in for a real server
given as `--toxiproxy URL`; the runs are real `docket chaos` and `docket game-day`
processes, as a user starts them.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from functools import partial
from pathlib import Path

import trio
from helpers import read_chain

from chaos.run.engine import run_chaos
from chaos.run.upstreams import PROXIES_FILE, left_alone, proxy_name, run_tag
from chaos.scenario import AgentSpec, Scenario
from chaos.toxiproxy import serve_toxiproxy
from chaos.toxiproxy.driver import ToxiproxyDriver

DEADLINE = 90  # seconds for a test's processes: a bound, not an expectation
TAGGED = re.compile(r"docket_[0-9a-f]{6}_openai")

# An agent that holds its run open until the Toxiproxy lists two docket proxies in
# front of openai at once (its own run's and the other's), then until the other run's
# waiter has seen them too (a file each in a shared folder), and reports what it saw.
# Without that second wait, a run could end and take its proxy away before the other
# run's waiter first looked.
WAITER = """\
import http.client, json, os, sys, time
host, port, seen = sys.argv[1], int(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + 20
def names():
    api = http.client.HTTPConnection(host, port, timeout=5)
    api.request("GET", "/proxies")
    found = sorted(json.loads(api.getresponse().read()))
    api.close()
    return [n for n in found if n.startswith("docket_") and n.endswith("_openai")]
while len(ours := names()) < 2:
    if time.monotonic() > deadline:
        sys.exit(f"never saw two docket proxies at once: {ours}")
    time.sleep(0.02)
open(os.path.join(seen, str(os.getpid())), "w").close()
while len(os.listdir(seen)) < 2:
    if time.monotonic() > deadline:
        sys.exit("the other run's waiter never saw both proxies")
    time.sleep(0.02)
print(json.dumps({"saw": ours}))
"""


async def docket(*args: str, cwd: Path) -> tuple[int, str, str]:
    done = await trio.run_process(
        [sys.executable, "-m", "docket", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        cwd=cwd,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def proxies_recorded(folder: Path) -> set[str]:
    """The proxy names in the run's net fault records (from the chain on disk)."""
    return {e["proxy"] for e in read_chain(folder / "ledger.jsonl") if "proxy" in e}


async def names_on(url: str) -> list[str]:
    return await trio.to_thread.run_sync(ToxiproxyDriver(url).proxy_names)


async def test_two_runs_at_once_get_their_own_proxies_and_both_finish(tmp_path):
    waiter = tmp_path / "waiter.py"
    waiter.write_text(WAITER)
    seen = tmp_path / "seen"
    seen.mkdir()
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve_toxiproxy, port=0))
            port = str(server.listening.port)
            scenario = tmp_path / "pair.yaml"
            scenario.write_text(
                json.dumps(
                    {
                        "faults": ["net:latency(5ms)@t 0"],
                        "agents": [
                            {"name": "caller", "mode": "once"},
                            {
                                "name": "waiter",
                                "command": [
                                    sys.executable,
                                    str(waiter),
                                    "127.0.0.1",
                                    port,
                                    str(seen),
                                ],
                            },
                        ],
                        "max_wall_clock": "30s",
                        "probe_every": 0,
                    }
                )
            )
            results: dict[str, tuple[int, str, str]] = {}

            async def run(name: str) -> None:
                results[name] = await docket(
                    "chaos", "--seed", "31", "--scenario", str(scenario),
                    "--toxiproxy", server.url, "--dir", str(tmp_path / name),
                    cwd=tmp_path,
                )  # fmt: skip

            async with trio.open_nursery() as runs:
                runs.start_soon(run, "a")
                runs.start_soon(run, "b")
            left = await names_on(server.url)
            nursery.cancel_scope.cancel()
    for name, (status, out, err) in results.items():
        assert status == 0, f"run {name}: {out}{err}"
        assert "run: 1 call(s), 1 ok" in out, out
    (a,), (b,) = proxies_recorded(tmp_path / "a"), proxies_recorded(tmp_path / "b")
    assert a != b and TAGGED.fullmatch(a) and TAGGED.fullmatch(b)
    for name in "ab":
        report = (tmp_path / name / "agents" / "waiter.out").read_text().splitlines()[-1]
        assert sorted(json.loads(report)["saw"]) == sorted([a, b])  # both there at once
    # whichever run started second saw the other's proxy: a note, and it was left alone
    other = {"a": b, "b": a}
    for name in "ab":
        for line in results[name][1].splitlines():
            if line.startswith("note:"):
                assert line == f"note: {left_alone(server.url, other[name])}"
    assert left == []  # each run took its own proxy away


async def test_a_docket_proxy_left_behind_is_reported_and_left_alone(tmp_path):
    leftovers = ["docket_0dead0_openai", "docket_openai"]  # a tagged one, an old-style one
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve_toxiproxy, port=0))
            driver = ToxiproxyDriver(server.url)
            for name in leftovers:
                await trio.to_thread.run_sync(driver.create_proxy, name, "127.0.0.1:9")
            status, out, err = await docket(
                "chaos", "--seed", "32", "--agent", "once", "--fault", "net:latency(5ms)@t 0",
                "--toxiproxy", server.url, "--dir", str(tmp_path / "r"),
                cwd=tmp_path,
            )  # fmt: skip
            left = await names_on(server.url)
            nursery.cancel_scope.cancel()
    assert status == 0, out + err
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert notes == [f"note: {left_alone(server.url, name)}" for name in leftovers]
    assert f"curl -X DELETE {server.url}/proxies/docket_openai" in notes[1]
    assert "Traceback" not in err
    (ours,) = proxies_recorded(tmp_path / "r")
    assert TAGGED.fullmatch(ours) and ours not in leftovers  # the run went through its own
    assert left == leftovers  # ours removed, theirs untouched


async def test_a_run_killed_by_its_own_fault_still_takes_its_proxies_away(tmp_path):
    # sigkill(supervisor) kills the worker that made the proxies: its caller removes them
    folder = tmp_path / "r"
    agent = AgentSpec(name="looper", mode="loop", calls=30, timeout=5.0)
    faults = ("net:latency(5ms)@t 0", "process:sigkill(supervisor)@seq 6")
    killed = Scenario(faults=faults, agents=(agent,), max_wall_clock=30.0, probe_every=0.0)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve_toxiproxy, port=0))
            driver = ToxiproxyDriver(server.url)
            await trio.to_thread.run_sync(
                driver.create_proxy, "docket_0dead0_openai", "127.0.0.1:9"
            )
            result = await run_chaos(killed, seed=34, folder=folder, toxiproxy_url=server.url)
            left = await names_on(server.url)
            nursery.cancel_scope.cancel()
    assert result.exit_status == 128 + signal.SIGKILL, result.reason
    (ours,) = proxies_recorded(folder)
    assert TAGGED.fullmatch(ours) and (folder / PROXIES_FILE).read_text() == f"{ours}\n"
    assert left == ["docket_0dead0_openai"]  # ours gone, the other left alone
    assert result.notes == [
        "no receipt: the recorder did not finish",
        left_alone(server.url, "docket_0dead0_openai"),
    ]


PHASE = """\
name: shared
title: A run on a shared Toxiproxy
fmea: [F06]
seed: 33
budget: 60s
run:
  agents: [{name: once, mode: once}]
  max_wall_clock: 20s
expect:
  - name: one call was forwarded
    query: "counts.\\"model.request\\""
    equals: 1
"""


async def test_game_day_names_a_docket_proxy_it_finds_and_leaves_it(tmp_path):
    phase = tmp_path / "shared.yaml"
    phase.write_text(PHASE)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(partial(serve_toxiproxy, port=0))
            driver = ToxiproxyDriver(server.url)
            await trio.to_thread.run_sync(
                driver.create_proxy, "docket_0dead0_openai", "127.0.0.1:9"
            )
            status, out, err = await docket(
                "game-day", "--phase", str(phase), "--toxiproxy", server.url,
                "--report", str(tmp_path / "report"),
                cwd=tmp_path,
            )  # fmt: skip
            left = await names_on(server.url)
            nursery.cancel_scope.cancel()
    assert status == 0, out + err
    assert out.splitlines()[0] == f"note: {left_alone(server.url, 'docket_0dead0_openai')}"
    assert left == ["docket_0dead0_openai"]


def test_a_run_s_tag_is_one_no_proxy_on_the_server_has():
    draws = iter(["aaaaaa", "bbbbbb", "cccccc"])
    taken = {"docket_aaaaaa_openai", "docket_bbbbbb_anthropic"}
    assert run_tag(taken, ["openai", "anthropic"], draw=lambda: next(draws)) == "cccccc"
    assert proxy_name("openai", "cccccc") == "docket_cccccc_openai"
    assert proxy_name("openai") == "docket_openai"  # the run's own embedded proxy
    assert TAGGED.fullmatch(proxy_name("openai", run_tag(set(), ["openai"])))
