"""Family `excluded`: an agent that turns what the snapshot leaves out against the watch
on it (docket/snapshot/excluded.py), each against a real snapshot and change scan.

Each probe builds a tree with a `.git` (HEAD, refs/heads/main, an index) and a
`node_modules`, both excluded, and a folder beside it that must never change
("outside"); takes a real snapshot into a real store; plays the agent (an excluded
root swapped for a link to "/" or to the outside, refs/ swapped for a link, HEAD a
FIFO, refs/ with tens of thousands of entries or a chain a thousand levels deep, an
excluded directory of a hundred thousand entries); then runs the real change scan
in a thread joined with a deadline.

Held: the change scan ended, and within IDENTITY_SECONDS + SLACK_S (the identity
step is bounded by its own deadline, never by the tree's size); nothing outside
changed; snapshot.changes' excluded_changed names the root with what the probe says
must be seen (the link as a link, never what it points to; a bound as truncated).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaos.attack import Figures

DEADLINE = 60.0  # a hang forever; each probe takes well under this
SLACK_S = 5.0  # the change scan of a small tree, beside the identity step's own bound


def bounded(fn: Callable, *args) -> tuple[str, object, float]:
    """("ok", result, seconds), ("raised", exception, seconds) or ("hung", None, DEADLINE)."""
    out: dict = {}

    def body() -> None:
        try:
            out["ok"] = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the probe's outcome, judged by the caller
            out["raised"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(DEADLINE)
    took = time.monotonic() - started
    if thread.is_alive():
        return "hung", None, took
    return ("ok", out["ok"], took) if "ok" in out else ("raised", out["raised"], took)


def make_tree(root: Path) -> Path:
    (root / ".git" / "refs" / "heads").mkdir(parents=True)
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".git" / "refs" / "heads" / "main").write_text("0" * 40 + "\n")
    (root / ".git" / "index").write_bytes(b"DIRC" + bytes(60))
    (root / "node_modules" / "pkg").mkdir(parents=True)
    (root / "node_modules" / "pkg" / "index.js").write_text("module.exports = 1\n")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('app')\n")
    return root


def listing(root: Path) -> dict[str, tuple]:
    """The outside folder's entries (it is small): kind, size, mtime."""
    out = {}
    for here, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            st = os.lstat(os.path.join(here, name))
            out[os.path.join(here, name)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def many(folder: Path, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        os.close(os.open(folder / f"r{i}", os.O_CREAT | os.O_WRONLY, 0o644))


def chain(base: Path, levels: int) -> None:
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
    finally:
        os.close(fd)


def _swap_for_link(name: str, target: Callable[[Path], str]) -> Callable:
    def agent(tree: Path, outside: Path, scale: int) -> None:
        shutil.rmtree(tree / name)
        os.symlink(target(outside), tree / name)

    return agent


def _refs_link(tree: Path, outside: Path, scale: int) -> None:
    shutil.rmtree(tree / ".git" / "refs")
    os.symlink("/", tree / ".git" / "refs")


def _head_fifo(tree: Path, outside: Path, scale: int) -> None:
    os.remove(tree / ".git" / "HEAD")
    os.mkfifo(tree / ".git" / "HEAD")


def _many_refs(tree: Path, outside: Path, scale: int) -> None:
    many(tree / ".git" / "refs" / "tags", scale)


def _deep_refs(tree: Path, outside: Path, scale: int) -> None:
    chain(tree / ".git" / "refs", 1000)


def _huge_excluded(tree: Path, outside: Path, scale: int) -> None:
    many(tree / "node_modules", 5 * scale)


@dataclass
class Probe:
    """`agent(tree, outside, scale)` spoils an excluded root; `wanted(change)` says
    whether excluded_changed's row for `root` shows what must be seen."""

    name: str
    agent: Callable
    root: str
    wanted: Callable[[dict], bool]
    quick: bool = False


def _is_link_to(target: str | None = None) -> Callable[[dict], bool]:
    def check(row: dict) -> bool:
        after = row["after"]
        return after.get("kind") == "link" and (target is None or after.get("target") == target)

    return check


PROBES = [
    Probe(".git swapped for a link to /", _swap_for_link(".git", lambda o: "/"), ".git",
          _is_link_to("/"), quick=True),
    Probe(".git swapped for a link to an outside folder",
          _swap_for_link(".git", lambda o: str(o)), ".git", _is_link_to(), quick=True),
    Probe("node_modules swapped for a link to /usr", _swap_for_link("node_modules",
          lambda o: "/usr"), "node_modules", _is_link_to("/usr")),
    Probe(".git/refs swapped for a link to /", _refs_link, ".git",
          lambda r: "refs_sha256" in r["what"] and r["after"]["git"]["refs_entries"] == 0,
          quick=True),
    Probe(".git/HEAD a FIFO", _head_fifo, ".git",
          lambda r: r["after"]["git"]["head_sha256"] == "not a file: fifo", quick=True),
    Probe(".git/refs with tens of thousands of entries", _many_refs, ".git",
          lambda r: r["after"]["git"]["refs_truncated"] is True, quick=True),
    Probe(".git/refs a 1,000-level chain", _deep_refs, ".git",
          lambda r: r["after"]["git"]["refs_truncated"] is True),
    Probe("node_modules with a hundred thousand entries", _huge_excluded, "node_modules",
          lambda r: r["after"]["truncated"] is True and r["after"]["entries"] == 1000,
          quick=True),
]  # fmt: skip


def try_probe(base: Path, probe: Probe, scale: int) -> tuple[bool, str]:
    from docket.snapshot.excluded import IDENTITY_SECONDS
    from docket.snapshot.run import changes, take

    tree, outside = make_tree(base / "tree"), base / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "HEAD").write_text("ref: refs/heads/outside\n")
    (outside / "sub" / "secret").write_text("outside bytes\n")
    snap, _ = take(0, str(tree), base / "run", base / "store", (".git", "node_modules"))
    before = listing(outside)
    probe.agent(tree, outside, scale)
    how, found, took = bounded(changes, snap)
    if how != "ok":
        return False, f"the change scan {how} after {took:.1f} s: {found!r}"
    assert isinstance(found, dict)
    rows = {r["path"]: r for r in found["excluded_changed"]}
    said = f"{took:.2f} s, excluded_changed {sorted(rows)}"
    if took > IDENTITY_SECONDS + SLACK_S:
        return False, f"ran long: {said}"
    if listing(outside) != before:
        return False, f"the outside changed; {said}"
    row = rows.get(probe.root)
    if row is None:
        return False, f"{probe.root} not named; {said}"
    if not probe.wanted(row):
        return False, f"{probe.root} named as {row['what']}, after {str(row['after'])[:200]}"
    return True, f"{said}, {probe.root}: {row['what']}"


def _clean(path: Path) -> None:
    # a 1,000-level chain is deeper than shutil.rmtree's recursion takes: rm -rf iterates
    subprocess.run(["rm", "-rf", "--", str(path)], check=False, timeout=120)


def run(folder: Path, quick: bool) -> Figures:
    figures = Figures("excluded")
    folder.mkdir(parents=True, exist_ok=True)
    # refs entries (the huge directory has five times): the quick form's is just past
    # what the watch reads (MAX_REF_ENTRIES, 10,000), the full form's five times that
    scale = 12_000 if quick else 50_000
    slowest = 0.0
    for n, probe in enumerate(p for p in PROBES if p.quick or not quick):
        base = folder / f"probe{n:02d}"
        started = time.monotonic()
        try:
            good, said = try_probe(base, probe, scale)
        except Exception as exc:  # noqa: BLE001 - a probe that crashes Docket is not held
            good, said = False, f"raised {type(exc).__name__}: {str(exc)[:200]}"
        finally:
            _clean(base)
        slowest = max(slowest, time.monotonic() - started)
        figures.add(good, f"excluded: {probe.name} -> {said}")
    figures.extra = {"slowest_probe_s": round(slowest, 2)}
    return figures
