package main

// Ledgers and receipts built here, byte by byte, for what the committed
// vectors do not hold: long lines, CRLF chained honestly, the receipt's
// size bound, NUL bytes, exact numbers in claims.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const startBody = `"run_id":"run-2026-11-18-0005","docket_version":"0.1.0","policy_digest":"sha256:5f0c6e2b9d8a7c4e3f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e","pricing":{"table_date":"2026-11-01","provenance":"docket/data/prices.json 2026-11-01"},"caps":%s`
const endBody = `"reason":"child exited","exit_status":0,"cap":null,"evidence":{"ledger_complete":true,"unwritten_events":0,"first_failing_seq":null,"write_failures":0}`
const receiptTemplate = `{"caps": {"breaches": [], "limits": %s, "warnings": []}, "docket_version": "0.1.0", "duration_ms": 17, "ended_at": "t1", "exit": {"cap": null, "reason": "child exited", "status": 0}, "faults": {"by_fault": {}, "injected": 0, "plan": null, "seed": null}, "format": "docket-receipt-1", "ledger": {"bytes": %d, "events": %d, "file": "ledger.jsonl", "head": "%s"}, "ops": {"evidence": {"first_failing_seq": null, "ledger_complete": true, "unwritten_events": 0, "write_failures": 0}}, "policy_digest": "sha256:5f0c6e2b9d8a7c4e3f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e", "pricing": {"provenance": "docket/data/prices.json 2026-11-01", "table_date": "2026-11-01", "unit_prices": {}}, "run_id": "run-2026-11-18-0005", "started_at": "t0", "totals": {"by_model": {}, "cached_tokens": 0, "cost_nusd": 0, "errors": 0, "input_tokens": 0, "model_calls": 0, "output_tokens": 0, "refused": 0, "responses": 0, "unpriced_calls": 0, "usd": "0.000000000"}}`

// run is what a honest run of a few events wrote.
type honestRun struct {
	ledger  []byte
	events  int
	head    string
	newline string // "\n", or "\r\n" to chain CRLF lines honestly
}

func (r *honestRun) add(typ, ts string, mono int, body string) {
	prev := r.head
	if prev == "" {
		prev = Genesis
	}
	line := fmt.Sprintf(`{"v":1,"seq":%d,"ts":"%s","mono_ms":%d,"type":"%s","prev":"%s"`, r.events, ts, mono, typ, prev)
	if body != "" {
		line += "," + body
	}
	line += "}" + strings.TrimSuffix(r.newline, "\n")
	sum := sha256.Sum256([]byte(line))
	r.head = hex.EncodeToString(sum[:])
	r.ledger = append(r.ledger, line+"\n"...)
	r.events++
}

// honest: session.start, the middle events' bodies (type x.note), session.end.
func honest(newline, caps string, middle ...string) *honestRun {
	r := &honestRun{newline: newline}
	r.add("session.start", "t0", 0, fmt.Sprintf(startBody, caps))
	for _, body := range middle {
		r.add("x.note", "t", 5, body)
	}
	r.add("session.end", "t1", 17, endBody)
	return r
}

func (r *honestRun) receipt(limits string) []byte {
	return []byte(fmt.Sprintf(receiptTemplate, limits, len(r.ledger), r.events, r.head))
}

// VERIFY_GO_KEEP=DIR keeps every case built here under DIR and lists it,
// with the verdict expected, in DIR/cases.tsv: for running another verifier
// (docket verify) over the same bytes.
var keep = os.Getenv("VERIFY_GO_KEEP")
var kept int
var lastPath string

func write(t *testing.T, ledger, receipt []byte) string {
	dir := t.TempDir()
	if keep != "" {
		kept++
		dir = filepath.Join(keep, fmt.Sprintf("case-%03d", kept))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ledger.jsonl"), ledger, 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "receipt.json")
	if err := os.WriteFile(path, receipt, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// outcome: "ok", "CODE", or "CODE seq S offset O".
func outcome(t *testing.T, receiptPath string) string {
	lastPath = receiptPath
	v, ierr := Verify(receiptPath, "")
	switch {
	case ierr != nil:
		return ierr.Code
	case v.OK:
		return "ok"
	case v.Seq != nil && v.Offset != nil:
		return fmt.Sprintf("%s seq %d offset %d", v.Code, *v.Seq, *v.Offset)
	}
	return v.Code
}

func expect(t *testing.T, name, got, want string) {
	t.Helper()
	if keep != "" {
		f, err := os.OpenFile(filepath.Join(keep, "cases.tsv"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintf(f, "%s\t%s\t%s\n", lastPath, name, strings.Fields(want)[0])
			f.Close()
		}
	}
	if got != want {
		t.Errorf("%s: got %s, want %s", name, got, want)
	}
}

func TestHonestRunsVerify(t *testing.T) {
	r := honest("\n", "{}")
	expect(t, "minimal", outcome(t, write(t, r.ledger, r.receipt("{}"))), "ok")
	// CRLF: the CR is part of the line, hashed and counted, and JSON whitespace.
	r = honest("\r\n", "{}", `"n":1`)
	expect(t, "crlf chained", outcome(t, write(t, r.ledger, r.receipt("{}"))), "ok")
	// A line far beyond bufio.Scanner's 64 KiB default, well under 64 MiB.
	r = honest("\n", "{}", `"pad":"`+strings.Repeat("x", 5<<20)+`"`)
	expect(t, "5 MiB line", outcome(t, write(t, r.ledger, r.receipt("{}"))), "ok")
	// Wide: two million values on one line, read as a skeleton, never built.
	r = honest("\n", "{}", `"a":[`+strings.Repeat("0,", 2_000_000)+`{"b":[1]}],"u":{"x":{"y":1},"z":2}`)
	expect(t, "2M values", outcome(t, write(t, r.ledger, r.receipt("{}"))), "ok")
	// Deep, but within 64 levels (the line's object is level 1).
	r = honest("\n", "{}", `"d":`+strings.Repeat("[", 63)+strings.Repeat("]", 63))
	expect(t, "64 levels", outcome(t, write(t, r.ledger, r.receipt("{}"))), "ok")
	// Non-ASCII as raw UTF-8 and as escapes.
	r = honest("\n", "{}", `"s":"é😀\u00e9\ud83d\ude00"`)
	expect(t, "unicode", outcome(t, write(t, r.ledger, r.receipt("{}"))), "ok")
}

func TestLinesThatBreakTheChain(t *testing.T) {
	r := honest("\n", "{}", `"d":`+strings.Repeat("[", 64)+strings.Repeat("]", 64))
	first := bytes.IndexByte(r.ledger, '\n') + 1
	expect(t, "65 levels", outcome(t, write(t, r.ledger, r.receipt("{}"))),
		fmt.Sprintf("malformed_line seq 1 offset %d", first))
	r = honest("\n", "{}", `"a":1,"\u0061":2`)
	expect(t, "escaped duplicate", outcome(t, write(t, r.ledger, r.receipt("{}"))),
		fmt.Sprintf("malformed_line seq 1 offset %d", first))
	r = honest("\n", "{}", `"s":"\ud800"`)
	expect(t, "lone surrogate", outcome(t, write(t, r.ledger, r.receipt("{}"))),
		fmt.Sprintf("malformed_line seq 1 offset %d", first))
	r = honest("\n", "{}", "\"s\":\"a\x00b\"")
	expect(t, "NUL in a line", outcome(t, write(t, r.ledger, r.receipt("{}"))),
		fmt.Sprintf("malformed_line seq 1 offset %d", first))
	r = honest("\n", "{}", `"n":NaN`)
	expect(t, "NaN", outcome(t, write(t, r.ledger, r.receipt("{}"))),
		fmt.Sprintf("malformed_line seq 1 offset %d", first))
	// 300,000 brackets on one line: refused, and no stack is at risk.
	r = honest("\n", "{}", `"d":`+strings.Repeat("[", 300000)+strings.Repeat("]", 300000))
	expect(t, "300,000 levels", outcome(t, write(t, r.ledger, r.receipt("{}"))),
		fmt.Sprintf("malformed_line seq 1 offset %d", first))
	// A BOM before the file's first line: not a ledger at all.
	r = honest("\n", "{}")
	expect(t, "BOM first", outcome(t, write(t, append([]byte("\ufeff"), r.ledger...), r.receipt("{}"))), "not_a_ledger")
	// The last line without its newline is a torn tail, where it starts.
	r = honest("\n", "{}", `"n":1`)
	cut := r.ledger[:len(r.ledger)-1]
	last := bytes.LastIndexByte(cut, '\n') + 1
	expect(t, "no final newline", outcome(t, write(t, cut, r.receipt("{}"))),
		fmt.Sprintf("torn_tail seq 2 offset %d", last))
	expect(t, "torn mid-line", outcome(t, write(t, r.ledger[:last+10], r.receipt("{}"))),
		fmt.Sprintf("torn_tail seq 2 offset %d", last))
	// Integers past 2^53-1 are not read as seq.
	big := bytes.Replace(r.ledger, []byte(`"seq":1,`), []byte(`"seq":9007199254740992,`), 1)
	expect(t, "seq 2^53", outcome(t, write(t, big, r.receipt("{}"))),
		fmt.Sprintf("malformed_line seq 1 offset %d", first))
}

func TestALineLongerThan64MiB(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 64 MiB")
	}
	r := honest("\n", "{}")
	first := bytes.IndexByte(r.ledger, '\n') + 1
	long := append(append([]byte(nil), r.ledger[:first]...), `{"v":1,"pad":"`...)
	long = append(long, bytes.Repeat([]byte("x"), MaxLineBytes)...)
	long = append(long, "\"}\n"...)
	expect(t, "line over 64 MiB", outcome(t, write(t, long, r.receipt("{}"))),
		fmt.Sprintf("malformed_line seq 1 offset %d", first))
	// The same bytes as a torn tail: refused as too long, not read.
	expect(t, "torn tail over 64 MiB", outcome(t, write(t, long[:len(long)-1], r.receipt("{}"))),
		fmt.Sprintf("malformed_line seq 1 offset %d", first))
}

func TestClaimsCompareByExactValue(t *testing.T) {
	r := honest("\n", `{"usd":1,"f":0.1}`)
	expect(t, "1.0 is 1", outcome(t, write(t, r.ledger, r.receipt(`{"usd":1.0,"f":1e-1}`))), "ok")
	expect(t, "no rounding", outcome(t, write(t, r.ledger, r.receipt(`{"usd":1,"f":0.10000000000000001}`))), "caps_mismatch")
	expect(t, "true is not 1", outcome(t, write(t, r.ledger, r.receipt(`{"usd":true,"f":0.1}`))), "caps_mismatch")
	lastPath = write(t, r.ledger, r.receipt(`{"usd":1,"f":0.2}`))
	v, _ := Verify(lastPath, "")
	expect(t, "path", v.Field, "caps.limits.f")
}

func TestReceiptBytes(t *testing.T) {
	r := honest("\n", "{}")
	good := r.receipt("{}")
	pad := func(n int) []byte {
		return append(append([]byte(nil), good...), bytes.Repeat([]byte(" "), n-len(good))...)
	}
	expect(t, "16 MiB exactly", outcome(t, write(t, r.ledger, pad(MaxReceiptBytes))), "ok")
	expect(t, "16 MiB + 1", outcome(t, write(t, r.ledger, pad(MaxReceiptBytes+1))), "receipt_unreadable")
	expect(t, "NUL", outcome(t, write(t, r.ledger, append(good, 0))), "receipt_unreadable")
	expect(t, "not UTF-8", outcome(t, write(t, r.ledger, append(good, 0xff))), "receipt_unreadable")
	expect(t, "BOM", outcome(t, write(t, r.ledger, append([]byte("\ufeff"), good...))), "receipt_not_json")
	expect(t, "CRLF layout", outcome(t, write(t, r.ledger, bytes.ReplaceAll(good, []byte(", "), []byte(",\r\n")))), "ok")
	dup := bytes.Replace(good, []byte(`"run_id"`), []byte(`"run_id": "x", "run\u005fid"`), 1)
	expect(t, "escaped duplicate", outcome(t, write(t, r.ledger, dup)), "receipt_malformed")
	surrogate := bytes.Replace(good, []byte(`"t0"`), []byte(`"\udc00"`), 1)
	expect(t, "lone surrogate", outcome(t, write(t, r.ledger, surrogate)), "receipt_not_json")
	// the receipt is level 1, caps 2, limits 3
	deep := bytes.Replace(good, []byte(`"limits": {}`), []byte(`"limits": {"a":`+strings.Repeat("[", 61)+strings.Repeat("]", 61)+`}`), 1)
	expect(t, "64 levels", outcome(t, write(t, r.ledger, deep)), "caps_mismatch")
	deeper := bytes.Replace(good, []byte(`"limits": {}`), []byte(`"limits": {"a":`+strings.Repeat("[", 62)+strings.Repeat("]", 62)+`}`), 1)
	expect(t, "65 levels", outcome(t, write(t, r.ledger, deeper)), "receipt_malformed")
	big := bytes.Replace(good, []byte(`"duration_ms": 17`), []byte(`"duration_ms": 9007199254740992`), 1)
	expect(t, "2^53", outcome(t, write(t, r.ledger, big)), "receipt_malformed")
	float := bytes.Replace(good, []byte(`"duration_ms": 17`), []byte(`"duration_ms": 17.0`), 1)
	expect(t, "17.0 is not an integer", outcome(t, write(t, r.ledger, float)), "receipt_malformed")
}

// A write that failed and could not be cut back leaves bytes past the
// record; a receipt that discloses it (unverified_tail) vouches for its
// events only, and the pass reads no further (spec section 8, step 5).
func TestUnverifiedTail(t *testing.T) {
	const evidence = `"evidence":{"ledger_complete":false,"unwritten_events":1,"first_failing_seq":2,"write_failures":1,"unverified_tail":true}`
	r := &honestRun{newline: "\n"}
	r.add("session.start", "t0", 0, fmt.Sprintf(startBody, "{}"))
	r.add("session.end", "t1", 17, strings.Replace(endBody, `"evidence":{"ledger_complete":true,"unwritten_events":0,"first_failing_seq":null,"write_failures":0}`, evidence, 1))
	receipt := bytes.Replace(r.receipt("{}"), []byte(`"evidence": {"first_failing_seq": null, "ledger_complete": true, "unwritten_events": 0, "write_failures": 0}`),
		[]byte(`"evidence": {"first_failing_seq": 2, "ledger_complete": false, "unwritten_events": 1, "write_failures": 1, "unverified_tail": true}`), 1)
	expect(t, "no tail", outcome(t, write(t, r.ledger, receipt)), "ok")
	whole := append(append([]byte(nil), r.ledger...), "{\"v\":1,\"seq\":2,\"junk\n"...)
	expect(t, "a whole line past the record", outcome(t, write(t, whole, receipt)), "ok")
	torn := append(append([]byte(nil), r.ledger...), `{"v":1,"seq":2,"ts":"`...)
	expect(t, "a torn line past the record", outcome(t, write(t, torn, receipt)), "ok")
	v, _ := Verify(lastPath, "")
	if v == nil || v.TailBytes != int64(len(torn)-len(r.ledger)) {
		t.Errorf("the verdict should count the bytes left unread: %+v", v)
	}
	// Without the disclosure the same bytes are a torn tail.
	plain := bytes.Replace(receipt, []byte(`, "unverified_tail": true`), nil, 1)
	expect(t, "undisclosed", outcome(t, write(t, torn, plain)), "torn_tail seq 2 offset "+fmt.Sprint(len(r.ledger)))
}

// Long lines are read as skeletons (json.go); here every line is, so the
// vectors and the cases above check that reading too.
func TestEverythingAgainAsSkeletons(t *testing.T) {
	saved := skeletonAbove
	skeletonAbove = -1
	defer func() { skeletonAbove = saved }()
	t.Run("vectors", TestVectors)
	t.Run("honest", TestHonestRunsVerify)
	t.Run("breaks", TestLinesThatBreakTheChain)
	t.Run("claims", TestClaimsCompareByExactValue)
	t.Run("tail", TestUnverifiedTail)
}
