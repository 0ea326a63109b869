"""A cache store shared between runs on one machine (`[cache] scope = "NAME"`):
real `docket run`s of the reference agent over a chaos stub, read back from the ledgers,
the receipts and the store file on disk.

Two runs one after the other: the second is answered from what the first stored, and its
cache.hit events name the first run (replays_run) and the seq of the model.response in the
first run's ledger, and each is proven genuine against that ledger (docket.cache.origin).
Two runs at once: every hit is counted once in the file (the flock around each
read-modify-write; no update lost). A truncated, corrupt, group-readable or foreign
store file is refused in one line and a cache.refused event, and the run goes on
without it (a bad store stops no run).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time

import pytest
import trio
from helpers import read_chain

from docket.cache.origin import hit_problem
from docket.cache.shared import SharedStore, identity
from docket.cache.store import Entry, Key
from docket.cli import main as cli_main
from docket.errors import InputError
from docket.policy import load_policy, policy_from_dict
from docket.receipts.verify import verify
from docket.run.supervisor import Supervisor, shared_cache
from docket.run.values import RunOptions

DEADLINE = 90  # supervised runs on a shared 2-core machine
STUB_KEY = "sk-real-upstream-key-shared-0a1b2c3d"
AGENT = [sys.executable, "-m", "docket", "agent", "--mode", "repeat", "--temperature", "0"]


def write_policy(path, url: str, scope: str = "team") -> None:
    path.write_text(
        f'[providers.openai]\nkind = "openai"\nbase_url = "{url}"\nkey_env = "STUB_KEY"\n'
        f'[cache]\nenabled = true\nscope = "{scope}"\ndir = "store"\n'
    )


async def supervised(policy, folder, calls: int):
    run = RunOptions(
        command=[*AGENT, "--calls", str(calls)], policy_path=str(policy), ledger_dir=str(folder)
    )
    outcome = await Supervisor(run).run()
    assert outcome.exit_status == 0, outcome.reason
    receipt = json.loads((folder / "receipt.json").read_text())
    assert verify(folder / "receipt.json").ok
    return read_chain(folder / "ledger.jsonl"), receipt


def of_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def store_doc(tmp_path, scope: str = "team") -> dict:
    return json.loads((tmp_path / "store" / f"{scope}.json").read_text())


async def test_a_second_run_is_answered_from_what_the_first_stored(
    stub_server, tmp_path, monkeypatch
):
    monkeypatch.setenv("STUB_KEY", STUB_KEY)
    policy = tmp_path / "docket.toml"
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as stub:
            write_policy(policy, stub.url)
            first, first_receipt = await supervised(policy, tmp_path / "r1", 3)
            second, second_receipt = await supervised(policy, tmp_path / "r2", 3)
            forwarded = len(stub.log)
    assert forwarded == 1  # the first run's first call; everything after came from the store
    first_run = first_receipt["run_id"]
    assert second_receipt["run_id"] != first_run
    (stored,) = [e for e in of_type(first, "model.response") if e.get("cache_stored")]
    (request,) = of_type(first, "model.request")
    hits = of_type(first, "cache.hit") + of_type(second, "cache.hit")
    assert len(hits) == 5 and not of_type(second, "model.request")
    for hit in hits:  # each names the first run and the seq of its model.response there
        assert (hit["replays_run"], hit["replays_seq"]) == (first_run, stored["seq"])
        assert hit["request_sha256"] == request["request_sha256"]
        assert hit["saved_nusd"] == stored["cost_nusd"] > 0
        assert hit["body_sha256"] == stored["cache_body_sha256"]
        assert hit_problem(hit, first) is None  # genuine, proven from the origin's ledger
    forged = {**hits[-1], "saved_nusd": 10**15}
    assert "is not what the stored call cost" in (hit_problem(forged, first) or "")
    forged = {**hits[-1], "body_sha256": "0" * 64}
    assert "the answer served is not the answer stored" in (hit_problem(forged, first) or "")
    assert "is not run" in (hit_problem(hits[-1], second) or "")
    assert [h["hits"] for h in hits] == [1, 2, 3, 4, 5]  # the brake counts across runs
    assert second_receipt["ops"]["cache"] == {
        "hits": 3,
        "misses": 0,
        "stored": 0,
        "refused_by_reason": {},
        "saved_nusd": 3 * stored["cost_nusd"],
    }
    assert second_receipt["totals"]["model_calls"] == 0
    doc = store_doc(tmp_path)
    ((entry),) = doc["entries"]
    assert (entry["run_id"], entry["seq"], entry["hits"]) == (first_run, stored["seq"], 5)
    folder = tmp_path / "store"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("team.json", "team.lock"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    assert sorted(p.name for p in folder.iterdir()) == ["team.json", "team.lock"]  # no temp


async def test_two_runs_at_once_count_every_hit_once(stub_server, tmp_path, monkeypatch):
    monkeypatch.setenv("STUB_KEY", STUB_KEY)
    policy = tmp_path / "docket.toml"
    calls = 40
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as stub:
            write_policy(policy, stub.url)
            await supervised(policy, tmp_path / "seed", 1)  # stores the answer
            env = {**os.environ, "STUB_KEY": STUB_KEY}

            async def run(name: str) -> None:
                argv = [sys.executable, "-m", "docket", "run", "--policy", str(policy)]
                argv += ["--ledger-dir", str(tmp_path / name), "--", *AGENT, "--calls", str(calls)]
                done = await trio.run_process(argv, env=env, capture_stdout=True, check=False)
                assert done.returncode == 0, name

            async with trio.open_nursery() as nursery:
                for name in ("a", "b"):
                    nursery.start_soon(run, name)
            forwarded = len(stub.log)
    assert forwarded == 1
    hits = []
    for name in ("a", "b"):
        hits += of_type(read_chain(tmp_path / name / "ledger.jsonl"), "cache.hit")
        assert verify(tmp_path / name / "receipt.json").ok
    # Each lookup read, counted and wrote the file under the lock: the hits' numbers
    # are 1..80, each once, and the file says 80 (a lost update would repeat a number;
    # without the flock this fails most runs here).
    assert sorted(h["hits"] for h in hits) == list(range(1, 2 * calls + 1))
    assert store_doc(tmp_path)["entries"][0]["hits"] == 2 * calls


def seeded_store(tmp_path, url: str = "http://127.0.0.1:9/v1") -> tuple:
    """A policy file and a valid store of one entry written for it (no run needed)."""
    policy = tmp_path / "docket.toml"
    write_policy(policy, url)
    store = shared_cache(load_policy(policy))
    assert store is not None
    entry = Entry(
        key=Key("openai", "/v1/chat/completions", "ab" * 32),
        status=200,
        headers=((b"content-type", b"application/json"),),
        body=b'{"choices": []}',
        stream=False,
        seq=3,
        stored_at=time.time(),
        cost_nusd=10650,
        model="gpt-4o-mini",
        run_id="20261201T000000Z-00000000",
    )
    assert store.put(entry, time.time())
    return policy, store.path


def refused_run(tmp_path, policy, capsys, name: str = "r") -> str:
    """`docket run` with a store it refuses: one line says so, a cache.refused event
    records it, and the run goes on without the store to its receipt."""
    folder = tmp_path / name
    code = cli_main(["run", "--policy", str(policy), "--ledger-dir", str(folder), "--",
                     sys.executable, "-c", "pass"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if "cache store" in x]
    assert line.endswith("; the run goes on without the store"), line
    (refused,) = [e for e in read_chain(folder / "ledger.jsonl") if e["type"] == "cache.refused"]
    assert line == f"docket: {refused['problem']}; the run goes on without the store"
    assert verify(folder / "receipt.json").ok
    return err


@pytest.mark.parametrize(
    ("spoil", "needle"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]), "is not JSON"),
        (lambda p: p.write_bytes(b""), "is empty (truncated?)"),
        (lambda p: p.write_bytes(b"\x00\xff" * 40), "is not JSON"),
        (lambda p: p.write_text("[" * 5000 + "]" * 5000), "is not JSON"),
        (lambda p: p.write_text('{"format": "other"}'), "is not a docket cache store"),
        (lambda p: p.chmod(0o644), "has group/other permissions"),
        (
            lambda p: p.write_text(p.read_text().replace('"status":200', '"status":"200"')),
            "is not sealed with this policy's provider keys",  # tests/test_cache_poison.py
        ),
        (lambda p: p.write_bytes(b" " * (1 << 27)), "is larger than max_entries and max_bytes"),
    ],
    ids=["truncated", "empty", "binary", "deep", "format", "mode", "entry", "huge"],
)
def test_a_spoiled_store_file_is_refused_in_one_line(tmp_path, capsys, spoil, needle):
    policy, path = seeded_store(tmp_path)
    spoil(path)
    err = refused_run(tmp_path, policy, capsys)
    assert f"cache store {path}: " in err and needle in err, err


def test_a_store_written_for_another_policy_is_refused(tmp_path, capsys):
    _, path = seeded_store(tmp_path, "http://127.0.0.1:9/v1")
    other = tmp_path / "other.toml"  # the same scope and folder, another upstream
    write_policy(other, "http://127.0.0.1:10/v1")
    err = refused_run(tmp_path, other, capsys)
    assert "holds another policy's entries" in err, err
    # a store copied under another scope's name is not that scope's either
    path.with_name("copy.json").write_bytes(path.read_bytes())
    path.with_name("copy.json").chmod(0o600)
    write_policy(other, "http://127.0.0.1:9/v1", scope="copy")
    err = refused_run(tmp_path, other, capsys, "r2")
    assert "is the store of scope 'team', not 'copy'" in err, err


async def test_a_store_spoiled_mid_run_is_a_miss_said_on_the_record(
    stub_server, tmp_path, monkeypatch
):
    """The file checked at the start is spoiled while the run goes on (the agent does it
    before its calls): each call is forwarded, its answer not stored, and says why."""
    monkeypatch.setenv("STUB_KEY", STUB_KEY)
    policy = tmp_path / "docket.toml"
    with trio.fail_after(DEADLINE):
        async with stub_server("openai") as stub:
            write_policy(policy, stub.url)
            await supervised(policy, tmp_path / "seed", 1)
            path = tmp_path / "store" / "team.json"
            spoil_then_ask = (
                f"import pathlib, subprocess, sys; pathlib.Path({str(path)!r}).write_text('{{');"
                f" sys.exit(subprocess.call({[*AGENT, '--calls', '2']!r}))"
            )
            run = RunOptions(
                command=[sys.executable, "-c", spoil_then_ask],
                policy_path=str(policy),
                ledger_dir=str(tmp_path / "r"),
            )
            outcome = await Supervisor(run).run()
            forwarded = len(stub.log)
    assert outcome.exit_status == 0, outcome.reason
    assert forwarded == 3  # the seed's call and both of these: nothing served from the file
    events = read_chain(tmp_path / "r" / "ledger.jsonl")
    assert not of_type(events, "cache.hit")
    closes = of_type(events, "model.response")
    assert [e.get("cache_refused") for e in closes] == ["store_unreadable"] * 2
    (refused,) = of_type(events, "cache.refused")  # once, not once a call
    assert refused["problem"] == f"cache store {path}: is not JSON (truncated or corrupt)"
    assert refused["seq"] < closes[0]["seq"]
    receipt = json.loads((tmp_path / "r" / "receipt.json").read_text())
    assert receipt["ops"]["cache"]["refused_by_reason"] == {"store_unreadable": 2}
    assert verify(tmp_path / "r" / "receipt.json").ok
    assert path.read_text() == "{"  # never written over: another run may want to see it


@pytest.mark.parametrize(
    ("cache", "needle"),
    [
        ({"scope": "team"}, "cache.dir: must name the folder of the shared store 'team'"),
        ({"scope": "run", "dir": "x"}, "cache.dir: names a shared store's folder"),
        ({"scope": "../up", "dir": "x"}, 'cache.scope: must be "run" or a store\'s name'),
        ({"scope": "a" * 65, "dir": "x"}, "cache.scope"),
    ],
)
def test_the_scope_and_its_folder_are_checked(cache, needle):
    with pytest.raises(InputError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        policy_from_dict({"cache": {"enabled": True, **cache}})


def test_the_folder_is_relative_to_the_policy_file(tmp_path, monkeypatch):
    policy, _ = seeded_store(tmp_path)
    monkeypatch.chdir("/")
    loaded = load_policy(policy)
    assert loaded.cache.dir == str(tmp_path / "store")
    store = shared_cache(loaded)
    assert isinstance(store, SharedStore) and store.check() == 1


def test_identity_names_the_upstream():
    p = policy_from_dict({"cache": {"enabled": True, "scope": "t", "dir": "d"}}).cache
    a = identity(p, {"openai": ("openai", "http://127.0.0.1:1/v1")})
    assert a == identity(p, {"openai": ("openai", "http://127.0.0.1:1/v1")})
    assert a != identity(p, {"openai": ("openai", "http://127.0.0.1:2/v1")})
    assert a != identity(p, {"openai": ("anthropic", "http://127.0.0.1:1/v1")})


def test_the_file_is_bounded_by_the_policy(tmp_path):
    policy = tmp_path / "docket.toml"
    write_policy(policy, "http://127.0.0.1:9/v1")
    policy.write_text(policy.read_text() + "max_entries = 3\n")
    store = shared_cache(load_policy(policy))
    assert store is not None
    for n in range(10):
        entry = Entry(
            key=Key("openai", "/v1/chat/completions", f"{n:064x}"),
            status=200,
            headers=((b"content-type", b"application/json"),),
            body=b'{"x": "' + b"x" * 100 + b'"}',
            stream=False,
            seq=n,
            stored_at=time.time(),
            cost_nusd=1,
            run_id="r",
        )
        assert store.put(entry, time.time())
    kept = store_doc(tmp_path)["entries"]
    assert [e["seq"] for e in kept] == [7, 8, 9]  # the least recently used went first
