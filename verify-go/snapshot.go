package main

// The receipt's `snapshot` section (spec section 7.7): one entry per
// snapshot.taken, in index order, with the counts of its last good
// snapshot.changes and what its last snapshot.restored says.

import "sort"

var snapshotCounts = []string{"created", "modified", "deleted", "mode_changed"}

type snapRoot struct {
	index           uint64
	root, digest    *Value
	files, bytes    uint64
	changes         []uint64 // nil: no change counts
	restored        bool
	applied, failed uint64
	verified        bool
}

type snapshotFold struct{ roots map[uint64]*snapRoot }

func (f *snapshotFold) add(e *Value, kind string) {
	index := count(e.Get("index"), kind+".index")
	if f.roots == nil {
		f.roots = map[uint64]*snapRoot{}
	}
	r := f.roots[index]
	if kind == "snapshot.taken" {
		if r != nil {
			bad("a second snapshot.taken for snapshot %d", index)
		}
		d := e.Get("manifest_sha256")
		if d == nil || d.Kind != String || !isHex64(d.Str) {
			bad("snapshot.taken.manifest_sha256 must be 64 lowercase hex digits")
		}
		f.roots[index] = &snapRoot{index: index, root: text(e.Get("root"), kind+".root"), digest: d,
			files: count(e.Get("files"), kind+".files"), bytes: count(e.Get("bytes"), kind+".bytes")}
		return
	}
	if r == nil {
		bad("%s for snapshot %d, which no snapshot.taken precedes", kind, index)
	}
	if kind == "snapshot.changes" {
		if e.Has("error") {
			return // the change scan failed: the counts stay null
		}
		counts := object(e.Get("counts"), kind+".counts")
		c := make([]uint64, len(snapshotCounts))
		for i, n := range snapshotCounts {
			c[i] = count(counts.Get(n), kind+".counts."+n)
		}
		r.changes = c
		return
	}
	failed := e.Get("failed")
	if failed == nil || failed.Kind != Array {
		bad("snapshot.restored.failed must be an array")
	}
	verified := e.Get("verified")
	if verified == nil || verified.Kind != Bool {
		bad("snapshot.restored.verified must be true or false")
	}
	r.applied = count(e.Get("applied"), kind+".applied")
	r.failed, r.verified, r.restored = uint64(len(failed.Items)), verified.B, true
}

// Snapshots: the derived `snapshot` list (empty when the run took none).
func (t *Tally) Snapshots() *Value {
	list := &Value{Kind: Array}
	var indexes []uint64
	for i := range t.snapshots.roots {
		indexes = append(indexes, i)
	}
	sort.Slice(indexes, func(a, b int) bool { return indexes[a] < indexes[b] })
	for _, i := range indexes {
		r := t.snapshots.roots[i]
		o := newObject().Set("index", num(r.index)).Set("root", r.root).Set("manifest_sha256", r.digest).
			Set("files", num(r.files)).Set("bytes", num(r.bytes))
		if r.changes == nil {
			o.Set("changes", null)
		} else {
			c := newObject()
			for k, n := range snapshotCounts {
				c.Set(n, num(r.changes[k]))
			}
			o.Set("changes", c)
		}
		if !r.restored {
			o.Set("restored", null)
		} else {
			o.Set("restored", newObject().Set("applied", num(r.applied)).Set("failed", num(r.failed)).
				Set("verified", boolean(r.verified)))
		}
		list.Items = append(list.Items, o)
	}
	return list
}

func nullOr(s *shape, what string) *shape {
	return leaf(func(v *Value) string {
		if v.Kind == Null {
			return ""
		}
		if _, _, found := shapeProblem(v, s, ""); found {
			return "must be null or " + what
		}
		return ""
	})
}

var snapshotShape = opt(&shape{listOf: obj(map[string]*shape{
	"index":           isCount,
	"root":            isStr,
	"manifest_sha256": isHex,
	"files":           isCount,
	"bytes":           isCount,
	"changes": nullOr(obj(map[string]*shape{"created": isCount, "modified": isCount,
		"deleted": isCount, "mode_changed": isCount}), "an object of the four counts"),
	"restored": nullOr(obj(map[string]*shape{"applied": isCount, "failed": isCount, "verified": isBool}),
		"an object of applied, failed, verified"),
})})

func init() { receiptShape.fields["snapshot"] = snapshotShape }
