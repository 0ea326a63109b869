package main

import (
	"fmt"
	"testing"
)

func event(t *testing.T, seq int, body string) *Value {
	t.Helper()
	v, err := Decode([]byte(fmt.Sprintf(`{"v":1,"seq":%d,"ts":"t","mono_ms":0,"prev":"x",%s}`, seq, body)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Open calls survive the compaction of closed ones, in seq order, and a
// call_id reused after its call closed opens a new call.
func TestOpenCallsAcrossManyCalls(t *testing.T) {
	tally := NewTally()
	seq := 0
	add := func(body string) {
		if msg := tally.Add(event(t, seq, body)); msg != "" {
			t.Fatal(msg)
		}
		seq++
	}
	for i := 0; i < 5000; i++ {
		add(fmt.Sprintf(`"type":"model.request","call_id":"c%d","model":"m"`, i))
		if i != 3 && i != 4000 {
			add(fmt.Sprintf(`"type":"model.response","call_id":"c%d","model":"m","cost_nusd":1,"priced":false`, i))
		}
	}
	add(`"type":"model.request","call_id":"c7","model":"m"`) // c7 again, after it closed
	add(`"type":"model.request","call_id":"c3","model":"m"`) // c3 again, still open: keeps its first seq
	got := ""
	for _, c := range tally.OpenCalls().Items {
		got += fmt.Sprintf("%s@%s ", c.Get("call_id").Str, c.Get("seq").Str)
	}
	want := "c3@6 c4000@7999 c7@9998 "
	if got != want {
		t.Fatalf("open calls %s, want %s", got, want)
	}
	if len(tally.calls) > 1024 {
		t.Errorf("closed calls were not dropped: %d kept", len(tally.calls))
	}
}
