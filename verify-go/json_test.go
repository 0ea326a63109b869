package main

import (
	"strings"
	"testing"
)

// Each text with how strict JSON (spec 2.1) reads it: "ok", "notjson", or "ambiguous".
var decodeCases = []struct{ text, want string }{
	{`{}`, "ok"},
	{` {"a":1} ` + "\t\r\n", "ok"},
	{"\ufeff{}", "notjson"}, // a byte-order mark is not JSON whitespace
	{`{"a":1,"a":2}`, "ambiguous"},
	{`{"a":1,"\u0061":2}`, "ambiguous"}, // equal after unescaping
	{`{"a":{"b":1},"b":{"b":2}}`, "ok"}, // one name per object, not per text
	{`{"a":1,"a":2,`, "ambiguous"},      // text order: the duplicate comes first
	{`{"a":1,"a"`, "notjson"},           // cut before the duplicate's value begins
	{`{"a":x,"a":2}`, "notjson"},
	{`{"a":"\ud800"}`, "notjson"},           // lone high surrogate
	{`{"a":"\udc00"}`, "notjson"},           // lone low surrogate
	{`{"a":"\ud800\u0041"}`, "notjson"},     // high not followed by a low
	{`{"a":"\ud83d\ude00"}`, "ok"},          // a pair
	{`{"a":"\u00e9\n\t\"\\\/"}`, "ok"},      // every escape
	{`{"a":"\x"}`, "notjson"},               // not an escape
	{"{\"a\":\"\x01\"}", "notjson"},         // raw control character
	{"{\"a\":\"\x00\"}", "notjson"},         // raw NUL
	{"{\"a\":\"\xed\xa0\x80\"}", "notjson"}, // an encoded surrogate is not UTF-8
	{"{\"a\":\"\xff\"}", "notjson"},
	{`{"a":NaN}`, "notjson"},
	{`{"a":Infinity}`, "notjson"},
	{`{"a":-Infinity}`, "notjson"},
	{`{"a":01}`, "notjson"},
	{`{"a":1.}`, "notjson"},
	{`{"a":.5}`, "notjson"},
	{`{"a":1e}`, "notjson"},
	{`{"a":-0}`, "ok"},
	{`{"a":123456789012345678901234567890e-999999999999999}`, "ambiguous"}, // rule 2.1.7: a 15-digit exponent
	{`{"a":123456789012345678901234567890e-269}`, "ok"},
	{`{"a":tru}`, "notjson"},
	{`{"a":1}{}`, "notjson"},
	{`{"a":1} x`, "notjson"},
	{`[1,]`, "notjson"},
	{`{"a" 1}`, "notjson"}, // no colon
	{`{"a":1 "b":2}`, "notjson"},
	{`[1 2]`, "notjson"},
	{`{1:2}`, "notjson"},
	{`[}`, "notjson"},
	{`{"a":1]`, "notjson"},
	{`{"a":1,}`, "notjson"},
	{``, "notjson"},
	{` `, "notjson"},
	{strings.Repeat("[", 64) + strings.Repeat("]", 64), "ok"},
	{strings.Repeat("[", 65) + strings.Repeat("]", 65), "ambiguous"},
	{`{"a":` + strings.Repeat("[", 63) + strings.Repeat("]", 63) + `}`, "ok"},
	{`{"a":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`, "ambiguous"},
	// text order: too deep before it is cut short; cut short before too deep
	{strings.Repeat("[", 65) + strings.Repeat("]", 64), "ambiguous"},
	{`{"a":x,"b":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`, "notjson"},
	{`{"a":1,"a":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`, "ambiguous"},
	{strings.Repeat("[", 300000) + strings.Repeat("]", 300000), "ambiguous"}, // read no further than level 65
}

func TestDecode(t *testing.T) {
	for _, c := range decodeCases {
		_, err := Decode([]byte(c.text))
		got := "ok"
		if err != nil {
			got = "notjson"
			if err.Ambiguous {
				got = "ambiguous"
			}
		}
		if got != c.want {
			shown := c.text
			if len(shown) > 60 {
				shown = shown[:60] + "..."
			}
			t.Errorf("%q: got %s, want %s (%v)", shown, got, c.want, err)
		}
	}
}

// The receipt's syntax-only reading agrees with Decode wherever Decode's
// answer does not depend on text order: what Decode accepts is JSON, and
// what it refuses as not JSON is not JSON read to the end either.
func TestJSONSyntaxAgreesWithDecode(t *testing.T) {
	for _, c := range decodeCases {
		syntax := jsonSyntax([]byte(c.text))
		switch {
		case c.want == "ok" && syntax != nil:
			t.Errorf("%.60q: Decode accepts it, the syntax check refuses it (%v)", c.text, syntax)
		case c.want == "notjson" && syntax == nil:
			t.Errorf("%.60q: Decode finds it not JSON, the syntax check accepts it", c.text)
		}
	}
}

func TestNumbersCompareByExactValue(t *testing.T) {
	same := [][2]string{{"1", "1.0"}, {"1", "1e0"}, {"100", "1e2"}, {"0", "-0"}, {"0", "0.000e5"},
		{"1.5", "15e-1"}, {"-2.50", "-25E-1"}, {"123456789012345678901234567890", "1.2345678901234567890123456789e29"}}
	differ := [][2]string{{"0.1", "0.10000000000000001"}, {"1", "-1"}, {"9007199254740993", "9007199254740992"},
		{"1e400", "1e401"}, {"2", "20"}}
	for _, p := range same {
		if !sameNumber(p[0], p[1]) {
			t.Errorf("%s and %s should be equal", p[0], p[1])
		}
	}
	for _, p := range differ {
		if sameNumber(p[0], p[1]) {
			t.Errorf("%s and %s should differ", p[0], p[1])
		}
	}
	if Equal(&Value{Kind: Number, Str: "1", Int: true}, boolean(true)) {
		t.Error("a number must never equal true")
	}
}

func TestIntegers(t *testing.T) {
	for text, ok := range map[string]bool{"0": true, "-0": true, "9007199254740991": true,
		"9007199254740992": false, "-1": false, "1.0": false, "1e2": false, "99999999999999999999": false} {
		v, err := Decode([]byte(text))
		if err != nil {
			t.Fatal(err)
		}
		if _, got := v.Count(); got != ok {
			t.Errorf("Count(%s) ok=%v, want %v", text, got, ok)
		}
	}
	if n, ok := (&Value{Kind: Number, Int: true, Str: "-9007199254740991"}).SignedInt(); !ok || n != -MaxInt {
		t.Error("-(2^53-1) is a signed integer in range")
	}
}

func TestPaths(t *testing.T) {
	cases := map[[2]string]string{
		{"", "run_id"}:                 "run_id",
		{"totals.by_model", "gpt-4o"}:  "totals.by_model.gpt-4o",
		{"totals.by_model", "gpt 4.1"}: `totals.by_model["gpt 4.1"]`,
		{"totals.by_model", ""}:        `totals.by_model[""]`,
		{"faults.by_fault", "é\"\n"}:   `faults.by_fault["é\"\n"]`,
	}
	for in, want := range cases {
		if got := joinName(in[0], in[1]); got != want {
			t.Errorf("joinName(%q, %q) = %s, want %s", in[0], in[1], got, want)
		}
	}
}

// Rule 2.1.7, on the number's text: the same edges as the spec's examples.
func TestNumberSize(t *testing.T) {
	within := []string{"1e300", "-1e300", "1.5e-300", "0.1e-299", "-0", "0e9999", "-0.0e-0",
		"99999999999999999999999999999999", "99999999999999999999999999999999e268", "5000000000000000000000000000000e-31"}
	past := []string{"1" + strings.Repeat("0", 4999), "100000000000000000000000000000000", "1e301", "10e300",
		"0.01e-299", "1e-5000", "1e00001", "0e00001", "1e9999999999999999999", "1e99999999",
		"0." + strings.Repeat("0", 32) + "1"}
	for _, n := range within {
		if _, err := Decode([]byte(`{"a":` + n + `}`)); err != nil {
			t.Errorf("%s: refused (%s), but it is within the bounds", n, err.Msg)
		}
	}
	for _, n := range past {
		_, err := Decode([]byte(`{"a":[` + n + `]}`))
		if err == nil || !err.Ambiguous {
			t.Errorf("%.40s: %v, want an ambiguous refusal", n, err)
		}
		// Not JSON is decided first: a syntax error after it makes the text not JSON.
		if err := jsonSyntax([]byte(`{"a":` + n + `,}`)); err == nil || err.Ambiguous {
			t.Errorf("%.40s then junk: %v, want a syntax refusal", n, err)
		}
	}
}
