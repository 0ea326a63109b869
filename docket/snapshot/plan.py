"""What a restore must do: pure, from the snapshot, the run's end state and the tree now.

For each path the run changed (or the ones asked for with --only, with the
changed directories above them), the state to bring back is the snapshot's.
A path whose state now is not the one the run left (changed again after the
run ended) is a conflict: skipped, unless forced. Steps come in an order that
works on a real tree: removals deepest first (a created directory's contents
before it), then creations shallowest first (a directory before what goes in
it), then directory modes deepest first (a read-only directory last).
Files are always rewritten whole (a new inode renamed into place), never
chmod'ed or written in place: an inode the run hard-linked elsewhere is left alone.
What the run put anywhere is removed whatever its kind (a FIFO, a device: manifest
OTHER); one the snapshot held is not made back (a conflict, named).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from docket.snapshot.manifest import DIR, FILE, LINK, RESTORABLE, Entry, depth, parents, under

REMOVE, MKDIR, WRITE, SYMLINK, CHMOD = "remove", "mkdir", "write", "symlink", "chmod"


@dataclass(frozen=True)
class Step:
    op: str
    path: str
    want: Entry | None  # the snapshot's entry (None for a removal)
    have: Entry | None  # what must be there when the step runs (re-checked at write time)

    def as_dict(self) -> dict:
        d: dict = {"op": self.op, "path": self.path}
        if self.want is not None:
            d["want"] = self.want.as_dict()
        if self.have is not None:
            d["have"] = self.have.as_dict()
        return d


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    conflicts: list[dict] = field(default_factory=list)  # {"path", "why", "expected", "found"}
    unchanged: list[str] = field(default_factory=list)  # already as in the snapshot

    def as_dict(self) -> dict:
        return {
            "steps": [s.as_dict() for s in self.steps],
            "conflicts": self.conflicts,
            "unchanged": self.unchanged,
        }


def _state(e: Entry | None) -> dict | None:
    return None if e is None else e.as_dict()


def targets(changed: Iterable[str], only: Iterable[str] | None) -> list[str]:
    """The changed paths to restore: all, or those under --only and the changed
    directories above them (a file cannot come back into a directory that is not)."""
    changed = set(changed)
    if only is None:
        return sorted(changed)
    only = list(only)
    picked = {p for p in changed if under(p, only)}
    for p in list(picked):
        picked.update(a for a in parents(p) if a in changed)
    return sorted(picked)


def make_plan(
    paths: Iterable[str],
    before: Mapping[str, Entry],
    run_end: Mapping[str, Entry],
    now: Mapping[str, Entry],
    *,
    force: bool = False,
) -> Plan:
    """`before`: the snapshot; `run_end`: the tree when the run ended; `now`: the tree
    now (each needs only the entries of `paths`, absence meaning absent)."""
    plan = Plan()
    removes: list[Step] = []
    creates: list[Step] = []
    chmods: list[Step] = []
    for path in sorted(set(paths)):
        want, have, left = before.get(path), now.get(path), run_end.get(path)
        if _state(have) == _state(want):
            plan.unchanged.append(path)  # as in the snapshot already (restored before?)
            continue
        if _state(have) != _state(left) and not force:
            plan.conflicts.append(
                {
                    "path": path,
                    "why": "changed after the run ended",
                    "expected": _state(left),
                    "found": _state(have),
                }
            )
            continue
        if want is not None and want.kind not in RESTORABLE:
            plan.conflicts.append(
                {
                    "path": path,
                    "why": f"a {want.target} in the snapshot: recorded, never copied, "
                    "so not made back",
                    "expected": _state(want),
                    "found": _state(have),
                }
            )
            continue
        keep_dir = have is not None and want is not None and have.kind == DIR == want.kind
        # A file or link over a file or link: renamed over it in one step (atomic).
        over = (
            have
            if have is not None and want is not None and DIR not in (have.kind, want.kind)
            else None
        )
        if have is not None and not keep_dir and over is None:
            removes.append(Step(REMOVE, path, None, have))
        if want is None:
            continue
        if want.kind == DIR:
            if not keep_dir:
                creates.append(Step(MKDIR, path, want, None))
            chmods.append(Step(CHMOD, path, want, have if keep_dir else None))
        elif want.kind == FILE:
            creates.append(Step(WRITE, path, want, over))
        elif want.kind == LINK:
            creates.append(Step(SYMLINK, path, want, over))
    # A directory that holds a conflict stays, and so does what it holds: removing
    # it would fail (not empty) or, forced, take the conflicting path with it.
    held = {a for c in plan.conflicts for a in parents(c["path"])}
    for s in removes:
        if s.path in held:
            plan.conflicts.append(
                {
                    "path": s.path,
                    "why": "holds a path in conflict",
                    "expected": None,
                    "found": _state(s.have),
                }
            )
    blocked = {s.path for s in removes if s.path in held}
    removes = [s for s in removes if s.path not in blocked]
    creates = [s for s in creates if s.path not in blocked]
    chmods = [s for s in chmods if s.path not in blocked]
    removes.sort(key=lambda s: (-depth(s.path), s.path))
    creates.sort(key=lambda s: (depth(s.path), s.path))
    chmods.sort(key=lambda s: (-depth(s.path), s.path))
    plan.steps = removes + creates + chmods
    return plan


def simulate(tree: dict[str, Entry], plan: Plan) -> dict[str, Entry]:
    """The plan applied to a tree held as a dict (the property tests' model of a filesystem).

    Raises ValueError where a real filesystem would refuse a step: removing a
    non-empty directory, creating under a missing parent or over an existing entry.
    """
    out = dict(tree)
    for s in plan.steps:
        p = s.path
        if s.op == REMOVE:
            if p not in out:
                raise ValueError(f"remove {p}: absent")
            if out[p].kind == DIR and any(q.startswith(p + "/") for q in out):
                raise ValueError(f"remove {p}: directory not empty")
            del out[p]
            continue
        for a in parents(p):
            if a not in out or out[a].kind != DIR:
                raise ValueError(f"{s.op} {p}: parent {a} missing")
        assert s.want is not None
        if s.op == CHMOD:
            if p not in out or out[p].kind != DIR:
                raise ValueError(f"chmod {p}: no directory")
            out[p] = s.want
        elif s.op in (WRITE, SYMLINK) and p in out and out[p].kind == DIR:
            raise ValueError(f"{s.op} {p}: a directory is there")
        elif s.op == MKDIR and p in out:
            raise ValueError(f"mkdir {p}: exists")
        else:
            out[p] = Entry(DIR, 0o700) if s.op == MKDIR else s.want
    return out
