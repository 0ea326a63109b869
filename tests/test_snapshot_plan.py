"""docket.snapshot's pure parts, property-tested: manifests, their diff, the restore plan.

A tree is modelled as a dict of path -> Entry (plan.simulate applies a plan to
it, refusing what a real filesystem would refuse). Properties: a plan made from
a run's changes brings the run's end state back to the snapshot exactly; a path
changed after the run is never touched (without --force); a path the run did not
change is never touched; a manifest survives its JSON; bad paths are refused.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from docket.snapshot.manifest import (
    DIR,
    FILE,
    LINK,
    Entry,
    Manifest,
    ManifestError,
    changes_event,
    check_path,
    diff,
    manifest_from_dict,
)
from docket.snapshot.plan import make_plan, simulate, targets

NAMES = st.sampled_from(["a", "b", "c", "d.txt", ".hidden"])
HASHES = st.sampled_from(["0" * 64, "1" * 64, "2" * 64])
MODES = st.sampled_from([0o644, 0o600, 0o755, 0o500])


@st.composite
def entries(draw) -> Entry:
    kind = draw(st.sampled_from([FILE, FILE, LINK, DIR]))
    if kind == FILE:
        return Entry(FILE, draw(MODES), sha256=draw(HASHES), size=3)
    if kind == LINK:
        return Entry(LINK, target=draw(st.sampled_from(["a", "../../etc/passwd", "/etc"])))
    return Entry(DIR, draw(MODES))


@st.composite
def trees(draw) -> dict[str, Entry]:
    paths = draw(st.sets(st.lists(NAMES, min_size=1, max_size=3).map("/".join), max_size=12))
    tree: dict[str, Entry] = {}
    for path in sorted(paths):
        parts = path.split("/")
        ok = True
        for i in range(1, len(parts)):
            parent = "/".join(parts[:i])
            if parent in tree and tree[parent].kind != DIR:
                ok = False
                break
            tree.setdefault(parent, Entry(DIR, draw(MODES)))
        if ok and path not in tree:
            tree[path] = draw(entries())
    # a directory with children stays a directory
    return {
        p: e
        for p, e in tree.items()
        if all(not q.startswith(p + "/") for q in tree) or e.kind == DIR
    }


def as_dicts(tree: dict[str, Entry]) -> dict:
    return {p: e.as_dict() for p, e in sorted(tree.items())}


@settings(deadline=None)
@given(trees(), trees())
def test_a_plan_brings_the_runs_end_state_back_to_the_snapshot(before, after):
    changes = diff(Manifest(before), Manifest(after))
    plan = make_plan(changes.paths(), before, after, after)
    assert not plan.conflicts
    assert as_dicts(simulate(after, plan)) == as_dicts(before)


@settings(deadline=None)
@given(trees(), trees(), trees())
def test_a_path_changed_after_the_run_is_left_alone_and_so_is_every_unchanged_path(
    before, after, now
):
    changed = diff(Manifest(before), Manifest(after)).paths()
    plan = make_plan(changed, before, after, now)
    touched = {s.path for s in plan.steps}
    conflicted = {c["path"] for c in plan.conflicts}
    assert touched <= set(changed)  # never a path the run did not change
    assert not touched & conflicted
    for path in touched:  # only where the tree is as the run left it
        assert (now.get(path) and now[path].as_dict()) == (
            after.get(path) and after[path].as_dict()
        )


@settings(deadline=None)
@given(trees(), trees())
def test_the_diff_names_every_path_whose_entry_differs_and_no_other(before, after):
    changes = diff(Manifest(before), Manifest(after))
    differing = {
        p for p in before.keys() | after.keys() if as_dicts(before).get(p) != as_dicts(after).get(p)
    }
    assert set(changes.paths()) == differing
    assert not set(changes.created) & set(changes.deleted)


@settings(deadline=None)
@given(trees())
def test_a_manifest_survives_its_json_and_its_digest_is_stable(tree):
    m = Manifest(tree)
    again = manifest_from_dict(json.loads(json.dumps(m.as_dict())))
    assert as_dicts(dict(again.entries)) == as_dicts(tree)
    assert again.digest() == m.digest()


def test_changes_event_carries_before_and_after_states():
    before = {"a": Entry(FILE, 0o644, "0" * 64, 1), "b": Entry(FILE, 0o644, "1" * 64, 1)}
    after = {"a": Entry(FILE, 0o600, "0" * 64, 1), "c": Entry(LINK, target="a")}
    fields = changes_event(
        Manifest(before), Manifest(after), diff(Manifest(before), Manifest(after))
    )
    assert fields["counts"] == {"created": 1, "modified": 0, "deleted": 1, "mode_changed": 1}
    assert fields["mode_changed"][0] == {
        "path": "a",
        "before": before["a"].as_dict(),
        "after": after["a"].as_dict(),
    }
    assert fields["created"][0]["before"] is None and fields["deleted"][0]["after"] is None


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "..",
        "a/../..",
        "a//b",
        "./a",
        "a/.",
        "a\0b",
        "a\\..\\b",
        "x" * 300,
        7,
        None,
    ],
)
def test_bad_paths_are_refused(path):
    with pytest.raises(ManifestError):
        check_path(path)


@pytest.mark.parametrize(
    "entries, why",
    [
        ({"/etc/passwd": {"kind": "file", "mode": 420, "sha256": "0" * 64, "size": 1}}, "absolute"),
        (
            {
                "a": {"kind": "file", "mode": 420, "sha256": "0" * 64, "size": 1},
                "a/b": {"kind": "dir", "mode": 493},
            },
            "parent",
        ),
        ({"b/c": {"kind": "dir", "mode": 493}}, "parent"),
        ({"a": {"kind": "device", "mode": 420}}, "kind"),
        ({"a": {"kind": "file", "mode": 0o17777, "sha256": "0" * 64, "size": 1}}, "mode"),
        ({"a": {"kind": "file", "mode": 420, "sha256": "../../x", "size": 1}}, "sha256"),
        ({"a": {"kind": "link", "target": ""}}, "target"),
    ],
)
def test_a_tampered_manifest_is_refused_whole(entries, why):
    with pytest.raises(ManifestError, match=why):
        manifest_from_dict({"format": "docket/snapshot/v1", "entries": entries})


def test_only_picks_paths_under_it_and_the_changed_directories_above_them():
    changed = ["d", "d/e", "d/e/f", "x"]
    assert targets(changed, ["d/e/f"]) == ["d", "d/e", "d/e/f"]
    assert targets(changed, ["x"]) == ["x"]
    assert targets(changed, ["d/e/fg"]) == []
    assert targets(changed, None) == sorted(changed)


# ---------------------------------------------------------------- the receipt's fold


def _taken(**kw):
    return {
        "type": "snapshot.taken",
        "index": 0,
        "root": "/r",
        "manifest_sha256": "a" * 64,
        "files": 1,
        "bytes": 2,
    } | kw


@pytest.mark.parametrize(
    "events, why",
    [
        ([{"type": "snapshot.changes", "index": 0, "counts": {}}], "no snapshot.taken precedes"),
        ([_taken(), _taken()], "a second snapshot.taken"),
        ([_taken(manifest_sha256="A" * 64)], "manifest_sha256"),
        ([_taken(files=-1)], "snapshot.taken.files"),
        (
            [_taken(), {"type": "snapshot.changes", "index": 0, "counts": {"created": 1}}],
            "counts.modified",
        ),
        (
            [
                _taken(),
                {
                    "type": "snapshot.restored",
                    "index": 0,
                    "applied": 1,
                    "failed": 0,
                    "verified": True,
                },
            ],
            "failed must be an array",
        ),
        (
            [
                _taken(),
                {
                    "type": "snapshot.restored",
                    "index": 0,
                    "applied": 1,
                    "failed": [],
                    "verified": 1,
                },
            ],
            "verified",
        ),
    ],
)
def test_the_tally_refuses_malformed_snapshot_events(events, why):
    from docket.receipts.tally import Tally, TallyError

    tally = Tally()
    with pytest.raises(TallyError, match=why):
        for seq, e in enumerate(events):
            tally.add({"seq": seq} | e)


def test_the_tally_folds_the_last_changes_and_restored_per_root():
    from docket.receipts.tally import Tally

    tally = Tally()
    counts = {"created": 1, "modified": 2, "deleted": 3, "mode_changed": 4}
    for e in (
        _taken(index=1),
        _taken(),
        {"type": "snapshot.changes", "index": 0, "counts": counts},
        {"type": "snapshot.changes", "index": 0, "error": "scan failed"},  # keeps the counts
        {"type": "snapshot.restored", "index": 0, "applied": 9, "failed": [{}], "verified": False},
    ):
        tally.add(e | {"seq": 0})
    claims = tally.snapshot.claims()
    assert [c["index"] for c in claims] == [0, 1]
    assert claims[0]["changes"] == counts
    assert claims[0]["restored"] == {"applied": 9, "failed": 1, "verified": False}
    assert claims[1]["changes"] is None and claims[1]["restored"] is None
    assert Tally().snapshot.claims() is None


# ---------------------------------------------------------------- names as bytes

RAW_NAMES = st.binary(min_size=1, max_size=40).filter(lambda b: b"/" not in b and b"\0" not in b)


@given(RAW_NAMES)
def test_every_name_has_one_spelling_that_gives_its_bytes_back(raw):
    from docket.snapshot.manifest import check_path, name_bytes, name_text

    text = name_text(raw)
    assert name_bytes(text) == raw
    assert not any(c < " " or c == "\x7f" for c in text)  # safe to print and to log
    assert "/" not in text and "\0" not in text
    if raw not in (b".", b".."):
        assert check_path(text) == text


@given(st.text(max_size=12))
def test_a_text_that_is_not_a_names_spelling_is_refused(text):
    from docket.snapshot.manifest import ManifestError, name_bytes, name_text

    try:
        raw = name_bytes(text)
    except ManifestError:
        return
    assert name_text(raw) == text  # accepted only as the one spelling of its bytes
