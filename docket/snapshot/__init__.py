"""Undoing a run: a content-addressed snapshot of a tree, the changes a run made to it,
and a restore that never writes outside it (README "Undo what a run changed").

  manifest.py  pure: a tree's entries (files by sha256, modes, links as links, dirs),
               its digest, and the diff of two manifests (what a run changed)
  store.py     the content-addressed object store (reflink, copy_file_range, copy),
               its lock (a snapshot shared, a prune exclusive) and its runs.jsonl
  confine.py   the openat/O_NOFOLLOW walker: every path resolved one component at
               a time under the root's fd, never across a symlink or a mount
  scan.py      a tree read through confine.py into a manifest (and the store)
  excluded.py  what the scan leaves out, watched: each excluded root's cheap identity
               before and after the run, and what changed
  plan.py      pure: what a restore must do, given the snapshot, the run's end
               state and the tree as it is now (conflicts included)
  restore.py   a plan applied through confine.py, each step re-checked at write time
  run.py       take, change scan, rollback; the snapshot's record in the run's folder
  session.py   --snapshot and --rollback-on-breach inside `docket run`
  command.py   `docket restore`
  diff.py      `docket restore --diff`: what a restore would change, as diffs or digests
  prune.py     `docket prune`: the store's objects no kept run references, removed
Each name is imported from the module that defines it.
"""
