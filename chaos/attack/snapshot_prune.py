"""Family `snapshot`, its `docket prune` probes: what an agent of the same user can plant
in the store (links out where objects, object folders, objects/, the lock or the store
itself belong; a FIFO for a run's record; a hundred thousand objects) before a prune
with --apply.

Each probe takes a real snapshot into a real store beside a real run folder, plants,
then runs prune in a thread joined with a deadline. Held: it ended within the
deadline; nothing outside the store changed (read by the family's own walk); every
object the kept run references is still there; and the outcome is the one wanted
(done, exit 0, with what was planted left in place; or refused with one line).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaos.attack.snapshot_kit import DEADLINE, bounded, fingerprint, make_tree

FAKE = "ab" + "c" * 62  # named as an object, stored by nobody


@dataclass(frozen=True)
class Prune:
    name: str
    plant: Callable[[Path, Path, Path], object]  # (store, run folder, outside)
    wanted: str  # "done" or "refused"
    quick: bool = True


def _object_link_out(store: Path, run: Path, outside: Path) -> None:
    (store / "objects" / FAKE[:2]).mkdir(exist_ok=True)
    os.symlink(outside / "secret", store / "objects" / FAKE[:2] / FAKE[2:])


def _folder_link_out(store: Path, run: Path, outside: Path) -> None:
    (outside / ("d" * 62)).write_text("named like an object, outside\n")
    os.symlink(outside, store / "objects" / "ee")


def _objects_link_out(store: Path, run: Path, outside: Path) -> None:
    held = store / "objects.real"
    os.rename(store / "objects", held)
    os.symlink(outside, store / "objects")


def _lock_link_out(store: Path, run: Path, outside: Path) -> None:
    (store / "lock").unlink(missing_ok=True)
    os.symlink(outside / "secret", store / "lock")


def _record_fifo(store: Path, run: Path, outside: Path) -> None:
    record = run / "snapshots" / "0.json"
    record.unlink()
    os.mkfifo(record)


def _runs_names_outside(store: Path, run: Path, outside: Path) -> None:
    with open(store / "runs.jsonl", "a") as f:
        f.write(json.dumps({"folder": str(outside)}) + "\n")


def _hardlink_out(store: Path, run: Path, outside: Path) -> None:
    (store / "objects" / FAKE[:2]).mkdir(exist_ok=True)
    os.link(outside / "secret", store / "objects" / FAKE[:2] / FAKE[2:])


def _many_objects(count: int) -> Callable:
    def plant(store: Path, run: Path, outside: Path) -> None:
        objects = store / "objects"
        for i in range(count):
            sha = hashlib.sha256(b"%d" % i).hexdigest()
            sub = objects / sha[:2]
            sub.mkdir(exist_ok=True)
            (sub / sha[2:]).write_bytes(b"%d" % i)

    return plant


PRUNES = [
    Prune("an object that is a symlink out", _object_link_out, "done"),
    Prune("an object folder that is a symlink out", _folder_link_out, "done"),
    Prune("objects/ a symlink out", _objects_link_out, "refused"),
    Prune("the lock a symlink out", _lock_link_out, "refused"),
    Prune("a run's record a FIFO", _record_fifo, "refused"),
    Prune("runs.jsonl names the folder outside", _runs_names_outside, "done"),
    Prune("an object hard-linked to a file outside", _hardlink_out, "done"),
    Prune("20,000 unreferenced objects", _many_objects(20_000), "done"),
    Prune("100,000 unreferenced objects", _many_objects(100_000), "done", quick=False),
]


def try_prune(base: Path, probe: Prune) -> tuple[bool, str]:
    from docket.errors import InputError
    from docket.snapshot.prune import prune_command
    from docket.snapshot.run import STORE_NAME, take

    tree, outside = make_tree(base / "tree"), base / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside bytes\n")
    runs = base / "runs"
    run, store = runs / "r1", runs / STORE_NAME
    snap, _ = take(0, str(tree), run, store)
    kept = {e.sha256 for e in snap.before.entries.values() if e.sha256}
    probe.plant(store, run, outside)
    out_before = fingerprint(outside)
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):
        how, result = bounded(
            prune_command, str(store), older_than=None, max_size=None, runs=[], apply=True
        )
    took = time.monotonic() - started
    if how == "hung":
        return False, f"did not end within {DEADLINE} s"
    if fingerprint(outside) != out_before:
        return False, "changed something outside the store"
    objects = store / "objects" if not (store / "objects.real").exists() else store / "objects.real"
    gone = [s for s in kept if not (objects / s[:2] / s[2:]).is_file()]
    if gone:
        return False, f"removed {len(gone)} object(s) the kept run references"
    if how == "raised":
        ok = probe.wanted == "refused" and isinstance(result, InputError)
        return ok, f"raised {type(result).__name__}: {result}"
    said = f"exit {result} in {took:.1f} s"
    if probe.wanted != "done" or result != 0:
        return False, said
    planted = store / "objects" / FAKE[:2] / FAKE[2:]
    if probe.plant is _object_link_out and not os.path.islink(planted):
        return False, said + " but the planted link was removed (it is not an object)"
    left = sum(len(os.listdir(objects / d)) for d in os.listdir(objects) if len(d) == 2)
    if probe.plant not in (_object_link_out, _folder_link_out) and left != len(kept):
        return False, said + f" but {left} objects are left, {len(kept)} referenced"
    return True, said
