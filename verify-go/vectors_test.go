package main

// Every case in spec/vectors/manifest.json: verdict, code, and, where the
// manifest gives them, seq, offset, field, and an ok vector's figures.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

type vector struct {
	Name     string   `json:"name"`
	Receipt  string   `json:"receipt"`
	Ledger   *string  `json:"ledger"`
	Verdict  string   `json:"verdict"`
	Exit     int      `json:"exit"`
	Code     *string  `json:"code"`
	Seq      *int64   `json:"seq"`
	Offset   *int64   `json:"offset"`
	Field    *string  `json:"field"`
	Events   *uint64  `json:"events"`
	Head     *string  `json:"head"`
	Bytes    *uint64  `json:"bytes"`
	Unbacked []string `json:"unbacked"`
}

const vectorsDir = "../spec/vectors"

func loadVectors(t *testing.T) []vector {
	data, err := os.ReadFile(filepath.Join(vectorsDir, "manifest.json"))
	if err != nil {
		t.Fatalf("reading the manifest: %v", err)
	}
	var m struct {
		Vectors []vector `json:"vectors"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("decoding the manifest: %v", err)
	}
	if len(m.Vectors) < 60 {
		t.Fatalf("only %d vectors in the manifest", len(m.Vectors))
	}
	return m.Vectors
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func eqInt(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
func eqStr(a, b *string) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}
func show64(p *int64) interface{} {
	if p == nil {
		return nil
	}
	return *p
}

func TestVectors(t *testing.T) {
	for _, vec := range loadVectors(t) {
		vec := vec
		t.Run(vec.Name, func(t *testing.T) {
			ledger := ""
			if vec.Ledger != nil {
				ledger = filepath.Join(vectorsDir, *vec.Ledger)
			}
			v, ierr := Verify(filepath.Join(vectorsDir, vec.Receipt), ledger)
			if vec.Verdict == "input_error" {
				if ierr == nil {
					t.Fatalf("want input error %s, got %+v", *vec.Code, v)
				}
				if ierr.Code != *vec.Code {
					t.Fatalf("want input error %s, got %s: %s", *vec.Code, ierr.Code, ierr.Msg)
				}
				return
			}
			if ierr != nil {
				t.Fatalf("want %s %v, got input error %s: %s", vec.Verdict, vec.Code, ierr.Code, ierr.Msg)
			}
			if vec.Verdict == "ok" {
				if !v.OK {
					t.Fatalf("want ok, got %s", summary(v))
				}
				if v.Events != *vec.Events || v.Head != *vec.Head || v.Bytes != *vec.Bytes {
					t.Fatalf("figures %d %s %d, want %d %s %d", v.Events, v.Head, v.Bytes, *vec.Events, *vec.Head, *vec.Bytes)
				}
				got := v.Unbacked
				if got == nil {
					got = []string{}
				}
				if !reflect.DeepEqual(got, vec.Unbacked) {
					t.Fatalf("unbacked %v, want %v", got, vec.Unbacked)
				}
				return
			}
			if v.OK || v.Code != *vec.Code {
				t.Fatalf("want %s, got %s", *vec.Code, summary(v))
			}
			if !eqInt(v.Seq, vec.Seq) || !eqInt(v.Offset, vec.Offset) || !eqStr(strOrNil(v.Field), vec.Field) {
				t.Fatalf("seq %v offset %v field %q; want %v %v %v (%s)", show64(v.Seq), show64(v.Offset),
					v.Field, show64(vec.Seq), show64(vec.Offset), vec.Field, summary(v))
			}
		})
	}
}
