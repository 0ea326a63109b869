"""--snapshot and --rollback-on-breach inside `docket run` (docket.run.supervisor calls this).

take(): each root snapshotted (in a worker thread: it reads the whole tree),
snapshot.taken recorded, before process.spawn. after_reap(): the change scan,
snapshot.changes recorded; if a cap's stop (exit 42) ended the run and
--rollback-on-breach was given, the changed paths restored and
snapshot.restored recorded, all before session.end and the receipt.
A snapshot that fails stops the run before the child starts (exit 2, the
reason in session.end): an agent is never run unprotected when protection
was asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from docket.boundary.stop import StopRequest
from docket.errors import EXIT_CAP_KILL, EXIT_USAGE, InputError
from docket.snapshot.confine import Refused, check_root
from docket.snapshot.excluded import said
from docket.snapshot.run import RootSnapshot, changes, default_store, rollback, take
from docket.snapshot.scan import DEFAULT_EXCLUDE
from docket.snapshot.store import StoreError


def _why(exc: Exception) -> str:
    if isinstance(exc, Refused):
        return exc.why
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if isinstance(exc, StoreError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def check_run_options(options: Any) -> None:
    """`docket run`'s flags, checked before anything starts (exit 2, one line)."""
    if options.rollback_on_breach and not options.snapshot:
        raise InputError(
            "run: --rollback-on-breach needs --snapshot (there is nothing to roll back to)"
        )
    for root in options.snapshot:
        try:
            check_root(root)
        except Refused as exc:
            raise InputError(f"run: --snapshot {root}: {exc.why}") from None


def exclude_of(policy: Any) -> tuple[str, ...]:
    section = getattr(policy, "snapshot", None)
    return tuple(section.exclude) if section is not None else DEFAULT_EXCLUDE


class SnapshotSession:
    def __init__(self, options: Any, policy: Any) -> None:
        self.options = options
        self.exclude = exclude_of(policy)
        self.snapshots: list[RootSnapshot] = []
        self.warnings: list[str] = []  # printed before `docket run`'s last line

    async def take(self, sup: Any) -> bool:
        folder = Path(sup.folder)
        store = (
            Path(self.options.snapshot_store)
            if self.options.snapshot_store
            else default_store(folder)
        )
        # docket-runs/ (the default): other runs' evidence, which a concurrent run may be
        # writing, is never this run's to snapshot or roll back.
        others = (folder.parent,) if self.options.ledger_dir is None else ()
        for index, root in enumerate(self.options.snapshot):
            try:
                snap, fields = await trio.to_thread.run_sync(
                    take, index, root, folder, store, self.exclude, others
                )
            except (Refused, OSError, StoreError) as exc:
                why = _why(exc)
                sup.request_stop(
                    StopRequest(
                        f"--snapshot {root}: cannot snapshot ({why})", exit_status=EXIT_USAGE
                    )
                )
                return False
            self.snapshots.append(snap)
            await sup._record("snapshot.taken", **fields)
        # A stop asked while the tree was copied (a signal, the wall-clock cap, which
        # counts the snapshot's time): the child is not started only to be stopped.
        return sup.stop_requested is None

    async def after_reap(self, sup: Any) -> None:
        for snap in self.snapshots:
            try:
                fields = await trio.to_thread.run_sync(changes, snap)
            except Exception as exc:  # noqa: BLE001 - recorded: the run still ends with its receipt
                why = _why(exc)
                await sup._record("snapshot.changes", index=snap.index, error=why)
                self.warnings.append(
                    f"--snapshot {snap.root}: the change scan failed ({why}): what the run "
                    "changed is not on record and nothing was rolled back (docket restore "
                    "compares the tree with the snapshot instead)"
                )
                continue
            await sup._record("snapshot.changes", **fields)
            excluded = said(snap.root, fields.get("excluded_changed") or [])
            if excluded is not None:
                self.warnings.append(excluded)
            if fields.get("skipped"):
                self.warnings.append(
                    f"--snapshot {snap.root}: {len(fields['skipped'])} path(s) could not be "
                    "snapshotted or scanned (devices, FIFOs, mounts...): see snapshot.changes' skipped"
                )
        stop = sup.stop_requested
        if not (
            self.options.rollback_on_breach
            and stop is not None
            and stop.exit_status == EXIT_CAP_KILL
        ):
            return
        for snap in self.snapshots:
            if snap.after is None:
                continue  # its change scan failed: what to undo is unknown, so nothing is
            try:
                fields = await trio.to_thread.run_sync(rollback, snap)
            except Exception as exc:  # noqa: BLE001 - recorded: the run still ends with its receipt
                why = _why(exc)
                fields = {
                    "index": snap.index,
                    "applied": 0,
                    "paths": [],
                    "failed": [],
                    "verified": False,
                    "differences": [],
                    "error": why,
                }
            await sup._record("snapshot.restored", **fields)
            if not fields["verified"]:
                left = fields.get("differences_count", len(fields.get("differences") or []))
                error = f" ({fields['error']})" if fields.get("error") else ""
                self.warnings.append(
                    f"the rollback of {snap.root} is incomplete{error}: "
                    f"{len(fields['failed'])} step(s) failed and {left} path(s) are not as in "
                    "the snapshot (named in snapshot.restored's failed and differences; "
                    "`docket restore RUN` plans what is left, which --apply retries unless "
                    "the store's objects are damaged)"
                )
