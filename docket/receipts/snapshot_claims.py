"""The receipt's `snapshot` section, folded from snapshot.taken / .changes / .restored.

Pure and bounded by the number of snapshot roots (one entry each, never the
change lists). spec/docket-receipt-1.md section 7.7 is the normative text: per
root (by `index`), what was snapshotted (root, manifest digest, files, bytes),
how many paths the run changed (null when the change scan failed or is absent)
and what a rollback restored (null when there was none).
"""

from __future__ import annotations

from docket.receipts.readers import HEX64, TallyError
from docket.receipts.readers import count as _count
from docket.receipts.readers import text as _text

CHANGE_COUNTS = ("created", "modified", "deleted", "mode_changed")


class SnapshotFold:
    def __init__(self) -> None:
        self.roots: dict[int, dict] = {}

    def _root(self, event: dict) -> dict:
        kind = event["type"]
        index = _count(event.get("index"), f"{kind}.index")
        root = self.roots.get(index)
        if root is None:
            raise TallyError(f"{kind} for snapshot {index}, which no snapshot.taken precedes")
        return root

    def on_taken(self, event: dict) -> None:
        index = _count(event.get("index"), "snapshot.taken.index")
        if index in self.roots:
            raise TallyError(f"a second snapshot.taken for snapshot {index}")
        root = _text(event.get("root"), "snapshot.taken.root")
        digest = event.get("manifest_sha256")
        if type(digest) is not str or not HEX64.match(digest):
            raise TallyError("snapshot.taken.manifest_sha256 must be 64 lowercase hex digits")
        self.roots[index] = {
            "index": index,
            "root": root,
            "manifest_sha256": digest,
            "files": _count(event.get("files"), "snapshot.taken.files"),
            "bytes": _count(event.get("bytes"), "snapshot.taken.bytes"),
            "changes": None,
            "restored": None,
        }

    def on_changes(self, event: dict) -> None:
        root = self._root(event)
        if "error" in event:
            return  # the change scan failed: how many changed is not known (stays null)
        counts = event.get("counts")
        if type(counts) is not dict:
            raise TallyError("snapshot.changes.counts must be an object")
        root["changes"] = {
            k: _count(counts.get(k), f"snapshot.changes.counts.{k}") for k in CHANGE_COUNTS
        }

    def on_restored(self, event: dict) -> None:
        root = self._root(event)
        failed, verified = event.get("failed"), event.get("verified")
        if type(failed) is not list:
            raise TallyError("snapshot.restored.failed must be an array")
        if type(verified) is not bool:
            raise TallyError("snapshot.restored.verified must be true or false")
        root["restored"] = {
            "applied": _count(event.get("applied"), "snapshot.restored.applied"),
            "failed": len(failed),
            "verified": verified,
        }

    def claims(self) -> list[dict] | None:
        """The receipt's `snapshot` (None: the run took none, and the receipt says nothing)."""
        if not self.roots:
            return None
        return [
            {
                **r,
                "changes": None if r["changes"] is None else dict(r["changes"]),
                "restored": None if r["restored"] is None else dict(r["restored"]),
            }
            for _, r in sorted(self.roots.items())
        ]
