package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// The strict reader against encoding/json's syntax check: what it accepts is
// JSON; and JSON in valid UTF-8 with no \u escape (so no lone surrogate) is
// accepted or refused only as ambiguous (a duplicate name, too deep).
// `go test -fuzz FuzzDecode` explores further; the seeds run in every `go test`.
func FuzzDecode(f *testing.F) {
	for _, c := range decodeCases {
		if len(c.text) < 1000 {
			f.Add([]byte(c.text))
		}
	}
	f.Add([]byte(`{"v":1,"seq":0,"a":[1,2.5e-3,-0,{"b":null}],"c":"é"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Decode(data)
		valid := json.Valid(data)
		if err == nil && !valid {
			t.Fatalf("accepted what is not JSON: %q", data)
		}
		if err != nil && !err.Ambiguous && valid && utf8.Valid(data) && !bytes.Contains(data, []byte(`\u`)) {
			t.Fatalf("refused JSON as not JSON: %q (%s)", data, err.Msg)
		}
		if err == nil && v == nil {
			t.Fatal("no value and no error")
		}
		// A receipt is judged over the whole text: ambiguous only if it is JSON.
		_, rerr := DecodeReceipt(data)
		if (rerr == nil) != (err == nil) {
			t.Fatalf("Decode and DecodeReceipt disagree on accepting %q", data)
		}
		if rerr != nil && rerr.Ambiguous && !valid {
			t.Fatalf("called a receipt that is not JSON ambiguous: %q (%s)", data, rerr.Msg)
		}
		if rerr != nil && !rerr.Ambiguous && valid && utf8.Valid(data) && !bytes.Contains(data, []byte(`\u`)) {
			t.Fatalf("refused a JSON receipt as not JSON: %q (%s)", data, rerr.Msg)
		}
	})
}
