"""`docket restore RUN_DIR [--apply] [--only PATH ...] [--force]`.

Reads the run's ledger (its chain checked: a broken ledger is refused) for
snapshot.taken, snapshot.changes and snapshot.restored, and each root's
snapshots/N.json (its digest must be the one snapshot.taken recorded). The
paths the run changed are planned back to their snapshot state; a path changed
again since the run ended (or since its rollback) is a conflict, skipped unless
--force. Without --apply nothing in the tree changes. Either way restore.json
(docket/restore/v1: planned, applied, skipped and failed, and why) is written
beside the evidence; the ledger and receipt are never written.
Exit 0: done (or nothing to do); 1: a conflict or a failed step; 2: bad input.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from docket.durable import replace_file
from docket.errors import EXIT_CHECK_FAILED, EXIT_OK, InputError
from docket.snapshot.confine import Refused, Tree
from docket.snapshot.manifest import ManifestError, check_path
from docket.snapshot.plan import targets
from docket.snapshot.run import (
    RestoreInputError,
    RootRestore,
    current,
    load_record,
    states_from_rows,
)

FORMAT = "docket/restore/v1"
CHANGE_KINDS = ("created", "modified", "deleted", "mode_changed")


def snapshot_events(ledger: Path) -> dict[int, dict[str, dict]]:
    """index -> {event type: event} for the snapshot events of a chain-checked ledger."""
    from docket.ledger.chain import ChainError, ChainVerifier
    from docket.ledger.reader import LineTooLong, iter_lines

    verifier = ChainVerifier()
    out: dict[int, dict[str, dict]] = {}
    try:
        fd = _open_regular_file(ledger)
    except OSError as exc:
        raise InputError(f"restore: ledger {ledger}: cannot read ({exc.strerror})") from None
    try:
        # Read through the fd checked to be a regular file (a FIFO swapped in for the
        # ledger would block a plain open() forever).
        for line in iter_lines(f"/proc/self/fd/{fd}"):
            if not line.complete:
                break  # a torn tail: the lines before it stand
            event = verifier.feed(line.data)
            kind = event.get("type")
            if isinstance(kind, str) and kind.startswith("snapshot."):
                index = event.get("index")
                if type(index) is int:
                    out.setdefault(index, {})[kind] = event
    except ChainError as exc:
        raise InputError(f"restore: ledger {ledger}: the chain does not hold ({exc})") from None
    except LineTooLong as exc:
        raise InputError(f"restore: ledger {ledger}: {exc}") from None
    except OSError as exc:
        raise InputError(f"restore: ledger {ledger}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    return out


def _open_regular_file(path: Path) -> int:
    """`path` opened without blocking or following a link; OSError unless a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    return fd


def plan_root(
    folder: Path, events: dict[str, dict], only: list[str] | None, force: bool
) -> RootRestore:
    from docket.snapshot.plan import make_plan

    taken, changed = events.get("snapshot.taken"), events.get("snapshot.changes")
    if taken is None:
        raise RestoreInputError("the ledger has no snapshot.taken for it")
    before, root, store, exclude = load_record(folder, taken)
    notes: list[str] = []
    if changed is None or "error" in changed:
        # The run did not end normally (its supervisor killed, the change scan failed):
        # what it changed is not on record, so every difference from the snapshot is.
        changed_paths, run_end = _differences_now(root, before, exclude)
        notes.append(
            "the ledger has no snapshot.changes (the run did not end normally): every "
            "difference from the snapshot is planned, and a change made after the run "
            "cannot be told from one the run made"
        )
    else:
        changed_paths, run_end = _recorded_changes(changed, events, before)
    paths = targets(changed_paths, only)
    with Tree(root, recorded=True) as tree:
        now, unreachable = current(tree, paths)
    blocked = {u["path"] for u in unreachable}
    plan = make_plan(
        [p for p in paths if p not in blocked], before.entries, run_end, now, force=force
    )
    plan.conflicts.extend(unreachable)
    return RootRestore(taken["index"], root, plan, store, notes=notes)


def _recorded_changes(changed: dict, events: dict[str, dict], before) -> tuple[list[str], dict]:
    """The paths snapshot.changes names, and the state each was left in (by the run, or
    by its rollback when snapshot.restored says one ran)."""
    rows = [row for kind in CHANGE_KINDS for row in changed.get(kind) or []]
    try:
        for row in rows:
            check_path(row.get("path") if isinstance(row, dict) else None)
        run_end = states_from_rows(rows, "after")
    except (ManifestError, AttributeError) as exc:
        raise RestoreInputError(f"snapshot.changes: {exc}") from None
    changed_paths = [row["path"] for row in rows]
    restored = events.get("snapshot.restored")
    if restored is not None:
        # Rolled back already: what it restored is expected as in the snapshot now.
        failed = {f.get("path") for f in restored.get("failed") or [] if isinstance(f, dict)}
        for path in changed_paths:
            if path not in failed:
                if path in before.entries:
                    run_end[path] = before.entries[path]
                else:
                    run_end.pop(path, None)
    return changed_paths, run_end


def _differences_now(root: str, before, exclude: list[str]) -> tuple[list[str], dict]:
    from docket.snapshot.manifest import diff
    from docket.snapshot.scan import Excluder, scan

    with Tree(root, recorded=True) as tree:
        now = scan(tree, Excluder(tuple(exclude))).manifest
    return list(diff(before, now).paths()), dict(now.entries)


def plan_roots(
    run_dir: str, only: list[str] | None, force: bool
) -> tuple[Path, list[str] | None, list[RootRestore]]:
    """The run's folder, --only as paths, and each snapshot root's plan (reads only)."""
    folder = Path(run_dir)
    ledger = folder / "ledger.jsonl"
    if not os.path.lexists(ledger):
        raise InputError(f"restore: {run_dir}: no ledger.jsonl (give a run's folder)")
    if only:
        for p in only:
            try:
                check_path(p.strip("/") if not p.startswith("/") else p)
            except ManifestError as exc:
                raise InputError(f"restore: --only {exc}") from None
        only = [p.strip("/") for p in only]
    found = snapshot_events(ledger)
    if not found:
        raise InputError(f"restore: {run_dir}: the run took no snapshot (docket run --snapshot)")
    roots = []
    for index in sorted(found):
        try:
            roots.append(plan_root(folder, found[index], only, force))
        except RestoreInputError as exc:
            raise InputError(f"restore: snapshot {index}: {exc}") from None
        except Refused as exc:
            raise InputError(f"restore: snapshot {index}: root {exc.path}: {exc.why}") from None
    return folder, only, roots


def restore_command(run_dir: str, *, apply: bool, only: list[str] | None, force: bool) -> int:
    from docket.snapshot.restore import apply_plan

    folder, only, roots = plan_roots(run_dir, only, force)
    for r in roots:
        if apply:
            # --force also removes a directory the run made with whatever is in it now
            # (what the record could not name: deeper than the bound, made after the run)
            with Tree(r.root, recorded=True) as tree:
                r.applied = apply_plan(tree, r.store, r.plan, sweep=force)
        _print(r, apply)
    report = {
        "format": FORMAT,
        "run_dir": str(folder.resolve()),
        "apply": apply,
        "force": force,
        "only": only,
        "roots": [
            {
                "index": r.index,
                "root": r.root,
                "planned": [s.as_dict() for s in r.plan.steps],
                "applied": r.applied.applied if r.applied else [],
                "failed": r.applied.failed if r.applied else [],
                "skipped": r.plan.conflicts,
                "unchanged": r.plan.unchanged,
                "notes": r.notes,
            }
            for r in roots
        ],
    }
    try:
        _write_json(folder / "restore.json", report)
    except OSError as exc:
        raise InputError(
            f"restore: cannot write {folder / 'restore.json'} ({exc.strerror}); "
            + ("the changes above were made" if apply else "nothing was changed")
        ) from None
    bad = any(r.plan.conflicts or (r.applied and r.applied.failed) for r in roots)
    return EXIT_CHECK_FAILED if bad else EXIT_OK


_WORDS = {
    "remove": "delete",
    "mkdir": "recreate directory",
    "write": "write",
    "symlink": "recreate link",
    "chmod": "set mode of",
}


def _print(r: RootRestore, apply: bool) -> None:
    print(f"root {r.root}:")
    failed = {(f["op"], f["path"]): f["why"] for f in (r.applied.failed if r.applied else [])}
    for s in r.plan.steps:
        verb = _WORDS[s.op]
        why = failed.get((s.op, s.path))
        if not apply:
            print(f"  would {verb} {s.path}")
        elif why is None:
            print(f"  {verb} {s.path}: done")
        else:
            print(f"  {verb} {s.path}: FAILED ({why})")
    for c in r.plan.conflicts:
        print(f"  conflict {c['path']}: {c['why']}; skipped (--force to overwrite)")
    for note in r.notes:
        print(f"  note: {note}")
    if not r.plan.steps and not r.plan.conflicts:
        print("  nothing to do: the tree's changed paths are as in the snapshot")
    if not apply and r.plan.steps:
        print("  (dry run: nothing changed; --apply to do it)")


def _write_json(path: Path, data: dict) -> None:
    text = json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    replace_file(path, text.encode("utf-8"))
