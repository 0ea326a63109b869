package main

// Spec section 8, step 2: whether a receipt is JSON is decided over the
// whole text first. A duplicate name or nesting past 64 levels is
// receipt_malformed (exit 1) only when the rest of the text is JSON; a
// syntax error or a lone surrogate anywhere makes it receipt_not_json (exit 2),
// whichever comes first in the text.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// judge writes text as a receipt (no ledger: step 2 decides before one is
// looked for) and returns the code Verify gives and the exit run gives.
func judge(t *testing.T, text string) (string, int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "receipt.json")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	code := outcome(t, path)
	// run prints its one line; keep it out of the test's output.
	devnull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	stdout, stderr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = devnull, devnull
	exit := run([]string{path})
	os.Stdout, os.Stderr = stdout, stderr
	return code, exit
}

func expectReceipt(t *testing.T, name, text, wantCode string, wantExit int) {
	t.Helper()
	code, exit := judge(t, text)
	if code != wantCode || exit != wantExit {
		t.Errorf("%s: got %s (exit %d), want %s (exit %d)", name, code, exit, wantCode, wantExit)
	}
}

func TestReceiptDuplicateFormatThenTrailingTextIsNotJSON(t *testing.T) {
	expectReceipt(t, "duplicate then trailing text",
		`{"format":"docket-receipt-1","format":"x"} trailing`, "receipt_not_json", 2)
}

func TestReceiptDuplicateFormatInValidJSONIsMalformed(t *testing.T) {
	expectReceipt(t, "duplicate in valid JSON",
		`{"format":"docket-receipt-1","format":"x"}`, "receipt_malformed", 1)
}

func TestReceiptDuplicateThenCutShortIsNotJSON(t *testing.T) {
	expectReceipt(t, "duplicate then cut short", `{"a":1,"a":2,`, "receipt_not_json", 2)
}

func TestReceiptDuplicateThenLoneSurrogateIsNotJSON(t *testing.T) {
	expectReceipt(t, "duplicate then a lone low surrogate",
		`{"format":"docket-receipt-1","format":"x","note":"\udc00"}`, "receipt_not_json", 2)
	expectReceipt(t, "duplicate then a lone high surrogate, deeper",
		`{"a":1,"a":2,"b":[{"c":"\ud800x"}]}`, "receipt_not_json", 2)
}

func TestReceiptNestedPast64(t *testing.T) {
	nested := func(n int, inner string) string {
		return strings.Repeat("[", n) + inner + strings.Repeat("]", n)
	}
	expectReceipt(t, "100 levels, valid", nested(100, "1"), "receipt_malformed", 1)
	expectReceipt(t, "100 levels, a syntax error at the end", nested(100, "1")+",", "receipt_not_json", 2)
	expectReceipt(t, "100 levels, a syntax error inside", nested(100, "1,"), "receipt_not_json", 2)
	expectReceipt(t, "100 levels, a lone surrogate inside", nested(100, `"\ud800"`), "receipt_not_json", 2)
	expectReceipt(t, "100 levels inside an object, valid",
		`{"format":"docket-receipt-1","a":`+nested(100, `{"b":null}`)+`}`, "receipt_malformed", 1)
	expectReceipt(t, "unbalanced: 100 open, 99 closed", strings.Repeat("[", 100)+strings.Repeat("]", 99),
		"receipt_not_json", 2)
	expectReceipt(t, "mismatched closer past 64", nested(100, "")[:199]+"}", "receipt_not_json", 2)
}

// No recursion: the whole-text reading keeps its own stack, so a text far
// deeper than any goroutine stack would hold frames for is still judged.
func TestReceiptNested300000(t *testing.T) {
	const n = 300000
	valid := strings.Repeat("[", n) + strings.Repeat("]", n)
	expectReceipt(t, "300,000 levels, valid", valid, "receipt_malformed", 1)
	expectReceipt(t, "300,000 levels, a syntax error at the end", valid+"x", "receipt_not_json", 2)
}
