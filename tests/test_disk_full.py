"""A disk that fills, or goes read-only, mid-run: the end of the record still fits, or says where it went.

Real filesystems (root only; skipped with the reason otherwise): a small tmpfs
the agent fills itself between its calls, and an ext4 image on a loop device
that the agent turns read-only between its calls (the kernel's own
errors=remount-ro path, through /sys/fs/ext4/<dev>/trigger_fs_error: a plain
`mount -o remount,ro` is refused while the ledger is open for writing). Every
mount and loop device a test makes is undone in a finally.

Each run is `python -m docket run` against an in-process stub, so the stub's
log says how many calls really went upstream; the ledger and receipt are read
back from their bytes.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
from helpers import read_events, with_keys

from chaos.stub.server import Stub, StubConfig
from docket.cli import main as docket_main
from docket.ledger.faults import FailOrdinals
from docket.run.supervisor import Supervisor, last_line
from docket.run.values import RunOptions

TIMEOUT = 90  # one supervised run on a shared 2-core machine
REAL_KEY = "sk-disk-full-provider-key-0123456789"

# The agent: `agent.py RESULT BEFORE ACTION TARGET AFTER`. It makes BEFORE calls,
# then ACTION ("fill": write TARGET until the volume refuses; "readonly": write to
# TARGET, an ext4 trigger_fs_error file), then AFTER calls, and writes what it saw
# to RESULT (on a volume that is not the one it broke).
AGENT = textwrap.dedent(
    r"""
    import errno, json, os, sys, urllib.error, urllib.request
    result, before, action, target, after = sys.argv[1:6]
    base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    statuses = []

    def call(n):
        body = json.dumps({"model": "gpt-4o-mini", "max_tokens": 8,
                           "messages": [{"role": "user", "content": f"call {n}"}]}).encode()
        req = urllib.request.Request(base + "/chat/completions", data=body, method="POST",
            headers={"authorization": "Bearer " + key, "content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                r.read()
                statuses.append(r.status)
        except urllib.error.HTTPError as e:
            statuses.append(e.code)

    for n in range(int(before)):
        call(n)
    broke = None
    if action == "fill":
        with open(target, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError as e:
                broke = errno.errorcode[e.errno]
            try:
                while True:  # the last pages, in smaller bites
                    f.write(b"\0" * 512)
            except OSError as e:
                broke = errno.errorcode[e.errno]
    elif action == "fillto":  # leave about N bytes free
        path, left = target.rsplit(":", 1)
        with open(path, "wb", buffering=0) as f:
            while True:
                vfs = os.statvfs(os.path.dirname(path))
                spare = vfs.f_bavail * vfs.f_frsize - int(left)
                if spare <= 0:
                    break
                f.write(b"\0" * min(spare, 1 << 20))
        broke = "low"
    elif action == "readonly":
        with open(target, "w") as f:
            f.write("docket test: the agent made this volume read-only")
        broke = "EROFS"
    def readyz():
        try:
            with urllib.request.urlopen(os.environ["DOCKET_BOUNDARY_URL"] + "/docket/readyz") as r:
                return {"status": r.status, **json.load(r)}
        except urllib.error.HTTPError as e:
            return {"status": e.code, **json.load(e)}

    ready = readyz()
    for n in range(int(after)):
        call(int(before) + n)
    with open(result, "w") as f:
        json.dump({"statuses": statuses, "broke": broke, "readyz": ready, "readyz_end": readyz()}, f)
    """
)


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem needs root")
    if not shutil.which("mount"):
        pytest.skip("no mount(8) on this machine")


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


@contextmanager
def tmpfs(folder: Path, size: str):
    """A tmpfs of `size` at `folder`, always unmounted afterwards."""
    _need_root()
    folder.mkdir()
    done = _run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)])
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        _run(["umount", "-l", str(folder)])


@contextmanager
def ext4_volume(tmp_path: Path, size_mb: int = 32):
    """An ext4 image on a loop device, mounted errors=remount-ro; yields (folder, the
    sysfs file that makes it read-only). Unmounted and detached afterwards."""
    _need_root()
    for tool in ("mkfs.ext4", "losetup"):
        if not shutil.which(tool):
            pytest.skip(f"no {tool} on this machine")
    image, folder = tmp_path / "ext4.img", tmp_path / "ext4"
    with open(image, "wb") as f:
        f.truncate(size_mb << 20)
    made = _run(["mkfs.ext4", "-q", "-F", str(image)])
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
    attached = _run(["losetup", "-f", "--show", str(image)])
    if attached.returncode != 0:
        pytest.skip(f"cannot attach a loop device: {attached.stderr.strip()}")
    device = attached.stdout.strip()
    try:
        folder.mkdir()
        mounted = _run(["mount", "-o", "errors=remount-ro", device, str(folder)])
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount {device}: {mounted.stderr.strip()}")
        try:
            trigger = Path("/sys/fs/ext4") / Path(device).name / "trigger_fs_error"
            if not trigger.exists():
                pytest.skip(f"{trigger} does not exist (kernel without it)")
            yield folder, trigger
        finally:
            _run(["umount", str(folder)])
    finally:
        _run(["losetup", "-d", device])


@contextmanager
def ext4_on_a_small_tmpfs(tmp_path: Path):
    """An ext4 volume whose device fails: a sparse 64 MiB image on a 24 MiB tmpfs, so
    once the tmpfs is full the loop device's writes fail (EIO), and ext4, its journal
    aborted, then refuses writes (EROFS). Yields (the ext4 folder, the tmpfs folder)."""
    with tmpfs(tmp_path / "backing", "24m") as backing:
        image, folder = backing / "ext4.img", tmp_path / "ext4"
        with open(image, "wb") as f:
            f.truncate(64 << 20)
        made = _run(["mkfs.ext4", "-q", "-F", str(image)])
        if made.returncode != 0:
            pytest.skip(f"mkfs.ext4 failed: {made.stderr.strip()}")
        attached = _run(["losetup", "-f", "--show", str(image)])
        if attached.returncode != 0:
            pytest.skip(f"cannot attach a loop device: {attached.stderr.strip()}")
        device = attached.stdout.strip()
        try:
            folder.mkdir()
            mounted = _run(["mount", "-o", "errors=continue", device, str(folder)])
            if mounted.returncode != 0:
                pytest.skip(f"cannot mount {device}: {mounted.stderr.strip()}")
            try:
                yield folder, backing
            finally:
                _run(["umount", str(folder)])
        finally:
            _run(["losetup", "-d", device])


def write_policy(path: Path, stub_url: str, ledger: str = "") -> Path:
    path.write_text(
        textwrap.dedent(
            f"""
            [providers.openai]
            kind = "openai"
            base_url = "{stub_url}"
            key_env = "DISK_STUB_KEY"
            [ledger]
            """
        )
        + textwrap.dedent(ledger)
    )
    return path


async def supervised(tmp_path: Path, folder: Path, ledger_policy: str, agent_args: list[str]):
    """`docket run` of the agent against a stub; (the process, the stub's log, the agent's result)."""
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    result = tmp_path / "agent-result.json"
    stub = Stub(StubConfig(kind="openai"))
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(stub.serve)
        policy = write_policy(tmp_path / "docket.toml", listening.url, ledger_policy)
        argv = [sys.executable, "-m", "docket", "run", "--policy", str(policy)]
        argv += ["--ledger-dir", str(folder), "--grace", "1", "--"]
        argv += [sys.executable, str(script), str(result), *agent_args]
        done = await trio.run_process(
            argv,
            env=dict(os.environ, DISK_STUB_KEY=REAL_KEY),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        nursery.cancel_scope.cancel()
    agent = json.loads(result.read_text()) if result.exists() else None
    return done, stub.log.entries(), agent


def stderr_last_line(done: subprocess.CompletedProcess) -> str:
    return done.stderr.decode().strip().splitlines()[-1]


def verify_says(receipt: Path, capsys, ledger: Path | None = None) -> tuple[int, str]:
    capsys.readouterr()
    args = ["verify", str(receipt)] + ([] if ledger is None else ["--ledger", str(ledger)])
    status = docket_main(args)
    return status, capsys.readouterr().out


def doctor_says(ledger: Path, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    status = docket_main(["doctor", "--json", str(ledger)])
    return status, json.loads(capsys.readouterr().out)


# ---------------------------------------------------------------- a tmpfs the agent fills


async def test_a_disk_the_agent_fills_ends_with_an_honest_receipt(tmp_path, capsys):
    """5 calls, the agent fills the ledger's volume, 20 more: all 25 go upstream (fail-open),
    and the run ends with session.end, an evidence.gap and a receipt that says what was lost."""
    with tmpfs(tmp_path / "vol", "20m") as vol, trio.fail_after(TIMEOUT):
        run = vol / "run"
        done, log, agent = await supervised(
            tmp_path, run, "min_free_bytes = 0\n", ["5", "fill", str(vol / "filler"), "20"]
        )
        stderr = done.stderr.decode()
        assert "internal error" not in stderr and "Traceback" not in stderr, stderr
        assert agent is not None and agent["broke"] == "ENOSPC", (agent, stderr)
        assert agent["statuses"] == [200] * 25  # fail-open: every call was answered
        # Readiness names the evidence path: the reserve that cannot be kept, the loss.
        problems = agent["readyz_end"]["problems"]
        assert agent["readyz_end"]["status"] == 503, agent
        assert any(
            p.startswith("ledger volume: the disk reserve cannot be kept (ENOSPC") for p in problems
        )
        assert any(p.startswith("ledger: ") and "unwritten" in p for p in problems), problems
        assert len(log) == 25  # and every one went upstream
        assert done.returncode == 0, stderr  # the agent's own exit status
        events = read_events(run / "ledger.jsonl", whole_file=True)
        types = [e["type"] for e in events]
        assert types[0] == "session.start" and types[-1] == "session.end", types
        assert "process.exit" in types
        # A gap before each line written after a loss: a call's closing event may
        # still fit in the room held for it when its request did not.
        gaps = [e for e in events if e["type"] == "evidence.gap"]
        assert gaps and all(g["error"].startswith("ENOSPC") for g in gaps)
        requests = types.count("model.request")
        assert requests < 25
        receipt = json.loads((run / "receipt.json").read_text())
        evidence = receipt["ops"]["evidence"]
        assert evidence["ledger_complete"] is False
        assert evidence["first_failing_seq"] == gaps[0]["seq"]
        assert evidence["unwritten_events"] == sum(g["lost"] for g in gaps) >= 25 - requests
        assert evidence["unrecorded_calls"] == 25 - requests  # the calls upstream saw, unrecorded
        assert evidence["last_error"].startswith("ENOSPC")
        assert events[-1]["evidence"]["unrecorded_calls"] == 25 - requests
        line = stderr_last_line(done)
        assert "exit 0" in line and "evidence incomplete" in line, line
        assert f"{25 - requests} model calls went upstream unrecorded" in line, line
        status, said = verify_says(run / "receipt.json", capsys)
        assert status == 0 and "ledger incomplete (disclosed)" in said, said
        status, diag = doctor_says(run / "ledger.jsonl", capsys)
        assert diag["evidence"]["complete"] is False, diag
        assert status == 1
        # Nothing of the reserve is left behind: the ledger's spare blocks are given back.
        assert not list(run.glob(".receipt*"))
        # A receipt that hides the loss is refused.
        hidden = json.loads(json.dumps(receipt))
        hidden["ops"]["evidence"]["unrecorded_calls"] = 0
        forged = tmp_path / "forged.json"
        forged.write_text(json.dumps(hidden))
        status, said = verify_says(forged, capsys, run / "ledger.jsonl")
        assert status == 1 and "evidence_mismatch" in said, said
        for name, value in (("ledger_complete", True), ("unwritten_events", 0)):
            hidden = json.loads(json.dumps(receipt))
            hidden["ops"]["evidence"][name] = value
            forged.write_text(json.dumps(hidden))
            status, said = verify_says(forged, capsys, run / "ledger.jsonl")
            assert status == 1 and "FAIL" in said, (name, said)
        assert sum(evidence["unwritten_by_type"].values()) == evidence["unwritten_events"]
        hidden = json.loads(json.dumps(receipt))
        hidden["ops"]["evidence"]["unwritten_by_type"]["model.request"] -= 1
        forged.write_text(json.dumps(hidden))
        status, said = verify_says(forged, capsys, run / "ledger.jsonl")
        assert status == 1 and "unwritten_by_type" in said, said
        hidden = json.loads(json.dumps(receipt))
        del hidden["ops"]["evidence"]["unrecorded_calls"]  # dropping the disclosure hides it too
        forged.write_text(json.dumps(hidden))
        status, said = verify_says(forged, capsys, run / "ledger.jsonl")
        assert status == 1 and "unrecorded_calls" in said, said


async def test_fail_fast_on_a_really_full_disk_exits_43(tmp_path, capsys):
    with tmpfs(tmp_path / "vol", "20m") as vol, trio.fail_after(TIMEOUT):
        run = vol / "run"
        done, log, agent = await supervised(
            tmp_path,
            run,
            "min_free_bytes = 0\nfail_fast_evidence = true\n",
            ["5", "fill", str(vol / "filler"), "20"],
        )
        stderr = done.stderr.decode()
        assert "internal error" not in stderr and "Traceback" not in stderr, stderr
        assert done.returncode == 43, stderr
        line = stderr_last_line(done)
        assert "exit 43" in line and "evidence" in line, line
        receipt = json.loads((run / "receipt.json").read_text())
        assert receipt["exit"]["status"] == 43
        assert receipt["ops"]["evidence"]["ledger_complete"] is False
        assert receipt["ops"]["evidence"]["unrecorded_calls"] == 0  # nothing went up unrecorded
        events = read_events(run / "ledger.jsonl", whole_file=True)
        assert len(log) == [e["type"] for e in events].count("model.request")
        status, said = verify_says(run / "receipt.json", capsys)
        assert status == 0, said


async def test_a_64k_tmpfs_with_no_floor_still_ends_legibly(tmp_path, capsys):
    with tmpfs(tmp_path / "vol", "64k") as vol, trio.fail_after(TIMEOUT):
        run = vol / "run"
        done, log, agent = await supervised(
            tmp_path, run, "min_free_bytes = 0\n", ["2", "fill", str(vol / "filler"), "10"]
        )
        stderr = done.stderr.decode()
        assert "internal error" not in stderr and "Traceback" not in stderr, stderr
        # 16 KiB for the receipt and 24 KiB for the ledger's end fit in 64 KiB: it runs.
        assert done.returncode == 0, stderr
        assert len(log) == 12
        events = read_events(run / "ledger.jsonl", whole_file=True)
        assert events[-1]["type"] == "session.end"
        receipt = json.loads((run / "receipt.json").read_text())
        assert receipt["ops"]["evidence"]["ledger_complete"] is False
        status, said = verify_says(run / "receipt.json", capsys)
        assert status == 0, said


# ---------------------------------------------------------------- a volume that turns read-only


@pytest.mark.parametrize("with_fallback_dir", [True, False])
async def test_a_volume_that_turns_read_only_puts_the_receipt_in_the_fallback(
    tmp_path, capsys, with_fallback_dir
):
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    ledger = "min_free_bytes = 0\n" + (
        f'fallback_dir = "{fallback}"\n' if with_fallback_dir else ""
    )
    with ext4_volume(tmp_path) as (vol, trigger), trio.fail_after(TIMEOUT):
        run = vol / "run"
        done, log, agent = await supervised(
            tmp_path, run, ledger, ["3", "readonly", str(trigger), "4"]
        )
        stderr = done.stderr.decode()
        assert "internal error" not in stderr and "Traceback" not in stderr, stderr
        assert agent is not None and agent["statuses"] == [200] * 7
        assert len(log) == 7
        assert done.returncode == 43, stderr  # the receipt is not where it belongs
        assert not (run / "receipt.json").exists()
        lines = stderr.strip().splitlines()
        assert "receipt" in lines[-1] and "EROFS" in lines[-1], lines[-1]
        # The receipt, as one JSON line on stderr, and in the policy's fallback folder.
        printed = json.loads(lines[-2])
        if not with_fallback_dir:
            assert "it is the JSON line above" in lines[-1], lines[-1]
            assert printed["ops"]["evidence"]["ledger_complete"] is False
            assert printed["ops"]["evidence"]["last_error"].startswith("EROFS")
            assert not list(fallback.iterdir())
            # Saved by whoever read stderr, it verifies against the ledger it names.
            saved = tmp_path / "from-stderr.json"
            saved.write_text(lines[-2])
            status, said = verify_says(saved, capsys, run / "ledger.jsonl")
            assert status == 0 and "ledger incomplete (disclosed)" in said, said
            return
        (saved,) = fallback.glob("*.receipt.json")
        receipt = json.loads(saved.read_text())
        assert printed["run_id"] == receipt["run_id"]
        evidence = receipt["ops"]["evidence"]
        assert evidence["ledger_complete"] is False
        assert evidence["last_error"].startswith("EROFS")
        events = read_events(run / "ledger.jsonl", whole_file=True)
        assert evidence["unrecorded_calls"] == 7 - [e["type"] for e in events].count(
            "model.request"
        )
        # The fallback receipt names the ledger relative to itself: verify takes it as is.
        status, said = verify_says(saved, capsys)
        assert status == 0 and "ledger incomplete (disclosed)" in said, said
        status, diag = doctor_says(run / "ledger.jsonl", capsys)
        assert diag["evidence"]["complete"] is not True, diag


# ---------------------------------------------------------------- below min_free_bytes, before any loss


async def test_below_min_free_bytes_an_event_and_readiness_turn_red_before_any_loss(
    tmp_path, capsys
):
    with tmpfs(tmp_path / "vol", "20m") as vol, trio.fail_after(TIMEOUT):
        run = vol / "run"
        left = 6 << 20
        done, log, agent = await supervised(
            tmp_path,
            run,
            'min_free_bytes = "12MiB"\n',
            ["3", "fillto", f"{vol / 'filler'}:{left}", "3"],
        )
        stderr = done.stderr.decode()
        assert done.returncode == 0, stderr
        assert agent["statuses"] == [200] * 6 and len(log) == 6
        # Readiness is red while the volume is short, naming it; nothing is lost yet.
        assert agent["readyz"]["status"] == 503, agent
        assert any(p.startswith("ledger volume: ") for p in agent["readyz"]["problems"])
        events = read_events(run / "ledger.jsonl", whole_file=True)
        (low,) = [e for e in events if e["type"] == "evidence.low_disk"]
        assert low["below"] is True and low["min_free_bytes"] == 12 << 20
        assert low["free_bytes"] < 12 << 20
        # Recorded as soon as a write saw the volume short: before the calls after the fill.
        requests = [e["seq"] for e in events if e["type"] == "model.request"]
        assert requests[2] < low["seq"] < requests[4], (requests, low["seq"])
        assert not [e for e in events if e["type"] == "evidence.gap"]
        receipt = json.loads((run / "receipt.json").read_text())
        assert receipt["ops"]["evidence"]["ledger_complete"] is True
        status, said = verify_says(run / "receipt.json", capsys)
        assert status == 0 and "ledger complete" in said, said
        status, diag = doctor_says(run / "ledger.jsonl", capsys)
        assert status == 0 and diag["evidence"]["complete"] is True, diag
        assert diag["evidence"]["low_disk"] == 1


# ---------------------------------------------------------------- a transient loss (no root needed)


async def test_a_transient_loss_is_named_in_the_last_line(tmp_path, capsys):
    """Space that comes back (the fault hook's ENOSPC on process.spawn) still leaves the
    record incomplete: the last line says so instead of a plain "exit 0"."""
    folder = tmp_path / "run"
    options = RunOptions(command=[sys.executable, "-c", "pass"], ledger_dir=str(folder))
    with trio.fail_after(TIMEOUT):
        supervisor = Supervisor(options, faults=FailOrdinals(errno.ENOSPC, 1, 2))
        outcome = await supervisor.run()
    assert outcome.exit_status == 0
    line = last_line(supervisor.run_id, outcome)
    assert line.startswith(f"docket: run {supervisor.run_id} ended (child exited with status 0)")
    assert "exit 0; receipt " in line
    assert "evidence incomplete: 1 events unwritten from seq 1 (ENOSPC: " in line, line
    assert "unrecorded" not in line  # no model call went upstream unrecorded
    events = read_events(folder / "ledger.jsonl", whole_file=True)
    assert [e["type"] for e in events] == [
        "session.start",
        "evidence.gap",
        "process.exit",
        "session.end",
    ]
    status, said = verify_says(folder / "receipt.json", capsys)
    assert status == 0 and "ledger incomplete (disclosed)" in said, said
    status, diag = doctor_says(folder / "ledger.jsonl", capsys)
    assert status == 1 and diag["verdict"] == "clean" and diag["evidence"]["complete"] is False
    capsys.readouterr()
    docket_main(["doctor", str(folder / "ledger.jsonl")])
    human = capsys.readouterr().out
    assert "verdict  whole chain, evidence incomplete" in human
    assert "evidence INCOMPLETE: 1 events lost in 1 evidence.gap records" in human


# ---------------------------------------------------------------- a device that fails (EIO)


@pytest.mark.parametrize("fail_fast", [True, False])
async def test_a_device_that_fails_mid_run_never_ends_in_an_internal_error(
    tmp_path, capsys, fail_fast
):
    """The agent fills the tmpfs under the ledger's ext4 image: a real EIO, then EROFS.
    With fail_fast_evidence the run stops with 43; without, it goes on and discloses; in
    both the receipt cannot be written in the run's folder and goes to the fallbacks."""
    fallback = tmp_path / "fallback"
    fallback.mkdir()
    ledger = f'min_free_bytes = 0\nfallback_dir = "{fallback}"\n'
    ledger += "fail_fast_evidence = true\n" if fail_fast else ""
    with ext4_on_a_small_tmpfs(tmp_path) as (vol, backing), trio.fail_after(TIMEOUT):
        run = vol / "run"
        done, log, agent = await supervised(
            tmp_path, run, ledger, ["3", "fill", str(backing / "filler"), "4"]
        )
        stderr = done.stderr.decode()
        assert "internal error" not in stderr and "Traceback" not in stderr, stderr
        assert done.returncode == 43, stderr
        (saved,) = fallback.glob("*.receipt.json")
        receipt = json.loads(saved.read_text())
        evidence = receipt["ops"]["evidence"]
        assert evidence["ledger_complete"] is False
        assert "EIO" in evidence["last_error"] or "EROFS" in evidence["last_error"], evidence
        # The record is the receipt's events; a write the kernel failed (EIO) and that
        # could not be cut back (EROFS by then) may follow them, disclosed.
        events = read_events(run / "ledger.jsonl")[: receipt["ledger"]["events"]]
        requests = [e["type"] for e in events].count("model.request")
        size = (run / "ledger.jsonl").stat().st_size
        assert evidence["unverified_tail"] is (size > receipt["ledger"]["bytes"]), (evidence, size)
        if fail_fast:
            assert receipt["exit"]["status"] == 43
            assert len(log) == requests  # nothing went upstream unrecorded
            assert evidence["unrecorded_calls"] == 0
        else:
            assert agent["statuses"] == [200] * 7 and len(log) == 7
            assert evidence["unrecorded_calls"] == 7 - requests > 0
        status, said = verify_says(saved, capsys)
        assert status == 0 and "ledger incomplete (disclosed)" in said, said
        assert ("bytes past the record" in said) is evidence["unverified_tail"], said


# ---------------------------------------------------------------- wherever the disk fills


@pytest.mark.parametrize("before", [0, 1, 3, 7])
async def test_wherever_the_disk_fills_every_call_is_recorded_or_counted(tmp_path, capsys, before):
    """Each call upstream is a model.request on disk or counted in unrecorded_calls, the
    run ends with session.end, and verify accepts the receipt: a disk-full point tried is a
    receipt that discloses."""
    with tmpfs(tmp_path / "vol", "20m") as vol, trio.fail_after(TIMEOUT):
        run = vol / "run"
        done, log, agent = await supervised(
            tmp_path, run, "min_free_bytes = 0\n", [str(before), "fill", str(vol / "f"), "6"]
        )
        assert done.returncode == 0, done.stderr.decode()
        events = read_events(run / "ledger.jsonl", whole_file=True)
        assert events[-1]["type"] == "session.end"
        receipt = json.loads((run / "receipt.json").read_text())
        evidence = receipt["ops"]["evidence"]
        requests = [e["type"] for e in events].count("model.request")
        assert len(log) == before + 6 == requests + evidence["unrecorded_calls"]
        status, said = verify_says(run / "receipt.json", capsys)
        assert status == 0, said


def test_a_volume_already_full_refuses_the_run_in_one_line(tmp_path):
    """With no floor (min_free_bytes = 0) on a full volume, the run does not start:
    the receipt's blocks cannot be reserved. One line, exit 2, no ledger."""
    with tmpfs(tmp_path / "vol", "64k") as vol:
        with open(vol / "filler", "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        policy = tmp_path / "docket.toml"
        policy.write_text("[ledger]\nmin_free_bytes = 0\n")
        done = subprocess.run(
            [sys.executable, "-m", "docket", "run", "--policy", str(policy), "--ledger-dir",
             str(vol / "run"), "--", sys.executable, "-c", "pass"],
            capture_output=True, text=True, timeout=TIMEOUT, check=False, env=with_keys(None),
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("docket: ledger folder ") and "cannot reserve 16384 bytes" in line
        assert "ENOSPC" in line
        assert list((vol / "run").iterdir()) == []  # nothing half-written
