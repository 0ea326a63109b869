package main

// Verification, step by step (spec section 8).

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"unicode/utf8"
)

const MaxReceiptBytes = 16 << 20

// InputError: verification could not start (exit 2, section 9.2).
type InputError struct {
	Code string
	Msg  string
}

func (e *InputError) Error() string { return e.Msg + " (" + e.Code + ")" }

// Verdict is ok, or the first failed check.
type Verdict struct {
	OK        bool
	Code      string
	Seq       *int64
	Offset    *int64
	Field     string
	Detail    string
	Events    uint64
	Head      string
	Bytes     uint64
	Figures   bool // Events, Head and Bytes are the chain's
	Claims    *Value
	Unbacked  []string
	Complete  bool
	TailBytes int64
}

func ptr(n int64) *int64 { return &n }

func failed(code, field, detail string) *Verdict {
	return &Verdict{Code: code, Field: field, Detail: detail}
}

// readReceipt: step 1 and 2.
func readReceipt(path string) (*Value, *Verdict, *InputError) {
	unreadable := func(format string, args ...interface{}) *InputError {
		return &InputError{"receipt_unreadable", "receipt " + path + ": " + fmt.Sprintf(format, args...)}
	}
	st, err := os.Stat(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil, nil, unreadable("no such file")
		}
		return nil, nil, unreadable("cannot read (%v)", errText(err))
	}
	if st.IsDir() {
		return nil, nil, unreadable("is a directory, not a file")
	}
	if !st.Mode().IsRegular() {
		return nil, nil, unreadable("not a regular file")
	}
	if st.Size() == 0 {
		return nil, nil, unreadable("is empty")
	}
	if st.Size() > MaxReceiptBytes {
		return nil, nil, unreadable("%d bytes is more than the 16 MiB a receipt may be", st.Size())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, unreadable("cannot read (%v)", errText(err))
	}
	if len(data) > MaxReceiptBytes { // grew since the stat
		return nil, nil, unreadable("more than the 16 MiB a receipt may be")
	}
	if len(data) == 0 {
		return nil, nil, unreadable("is empty")
	}
	if i := bytes.IndexByte(data, 0); i >= 0 {
		return nil, nil, unreadable("binary data (a NUL byte at byte %d), not text", i)
	}
	if !utf8.Valid(data) {
		return nil, nil, unreadable("not UTF-8 text")
	}
	receipt, perr := DecodeReceipt(data)
	if perr != nil {
		if perr.Ambiguous {
			return nil, failed("receipt_malformed", "", "receipt: "+perr.Msg), nil
		}
		return nil, nil, &InputError{"receipt_not_json", "receipt " + path + ": not JSON (" + perr.Msg + ")"}
	}
	if receipt.Kind != Object || !receipt.Has("format") {
		return nil, nil, &InputError{"not_a_receipt",
			"receipt " + path + `: not a docket receipt (no "format": "` + Format + `")`}
	}
	if f := receipt.Get("format"); f.Kind != String || f.Str != Format {
		return nil, nil, &InputError{"not_a_receipt",
			"receipt " + path + ": format " + Show(f) + " is not one this verifier reads (" + Format + ")"}
	}
	return receipt, nil, nil
}

func errText(err error) string {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err.Error()
	}
	return err.Error()
}

// checkLedgerFile: step 4.
func checkLedgerFile(path string) *InputError {
	unreadable := func(format string, args ...interface{}) *InputError {
		return &InputError{"ledger_unreadable", "ledger " + path + ": " + fmt.Sprintf(format, args...)}
	}
	st, err := os.Stat(path)
	if err != nil {
		if os.IsNotExist(err) {
			return unreadable("no such file")
		}
		return unreadable("cannot read (%s)", errText(err))
	}
	if st.Mode().IsRegular() && st.Size() == 0 {
		return &InputError{"empty_ledger", "ledger " + path + ": is empty"}
	}
	if st.IsDir() {
		return unreadable("is a directory, not a file")
	}
	if !st.Mode().IsRegular() {
		return unreadable("not a regular file")
	}
	f, err := os.Open(path)
	if err != nil {
		return unreadable("cannot read (%s)", errText(err))
	}
	defer f.Close()
	head := make([]byte, len(LedgerMagic))
	n, _ := readFull(f, head)
	if !bytes.Equal(head[:n], LedgerMagic) {
		return &InputError{"not_a_ledger", "ledger " + path + `: not a docket ledger (it does not begin with {"v":)`}
	}
	return nil
}

func readFull(f *os.File, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := f.Read(b[n:])
		n += m
		if err != nil || m == 0 {
			return n, err
		}
	}
	return n, nil
}

var claimChecks = []struct{ key, code string }{
	{"run_id", "run_mismatch"},
	{"docket_version", "run_mismatch"},
	{"started_at", "run_mismatch"},
	{"ended_at", "run_mismatch"},
	{"duration_ms", "duration_mismatch"},
	{"exit", "exit_mismatch"},
	{"totals", "total_mismatch"},
	{"pricing", "pricing_mismatch"},
	{"caps", "caps_mismatch"},
	{"policy_digest", "policy_mismatch"},
	{"faults", "faults_mismatch"},
}

// Verify runs section 8. ledgerPath "" means the ledger the receipt names.
func Verify(receiptPath, ledgerPath string) (*Verdict, *InputError) {
	receipt, v, ierr := readReceipt(receiptPath)
	if ierr != nil || v != nil {
		return v, ierr
	}
	if p, what, found := shapeProblem(receipt, receiptShape, ""); found {
		return failed("receipt_malformed", p, p+" "+what), nil
	}
	claimed := receipt.Get("ledger")
	ledger := ledgerPath
	if ledger == "" {
		ledger = filepath.Join(filepath.Dir(receiptPath), filepath.FromSlash(claimed.Get("file").Str))
	}
	if ierr := checkLedgerFile(ledger); ierr != nil {
		return nil, ierr
	}
	events, _ := claimed.Get("events").Count()
	evidence := receipt.Get("ops").Get("evidence")
	tail := evidence.Get("unverified_tail")
	stopAt := int64(-1)
	if tail != nil && tail.B {
		stopAt = int64(events)
	}
	scan, err := ScanLedger(ledger, events, stopAt)
	if err != nil {
		return nil, &InputError{"ledger_unreadable", "ledger " + ledger + ": cannot read (" + errText(err) + ")"}
	}
	var tailBytes int64
	if scan.Stopped {
		if st, err := os.Stat(ledger); err == nil {
			tailBytes = st.Size() - int64(scan.Size)
		}
	}
	withFigures := func(v *Verdict) *Verdict {
		v.Events, v.Head, v.Bytes, v.Figures = scan.Events, scan.Head, scan.Size, true
		return v
	}
	if e := scan.Chain; e != nil {
		if e.Seq == 0 && (e.Code == "malformed_line" || e.Code == "unsupported_version") {
			return nil, &InputError{"not_a_ledger", "ledger " + ledger + ": not a docket ledger (line 1: " + e.Detail + ")"}
		}
		v := withFigures(failed(e.Code, "", e.Detail))
		v.Seq, v.Offset = ptr(int64(e.Seq)), ptr(int64(e.Offset))
		return v, nil
	}
	if events != scan.Events {
		v := withFigures(failed("count_mismatch", "ledger.events",
			fmt.Sprintf("the receipt says %d events, the ledger has %d", events, scan.Events)))
		if events < scan.Events {
			v.Seq, v.Offset = ptr(int64(events)), ptr(scan.MarkOffset)
		} else {
			v.Seq, v.Offset = ptr(int64(scan.Events)), ptr(int64(scan.Size))
		}
		return v, nil
	}
	if h := claimed.Get("head").Str; h != scan.Head {
		v := withFigures(failed("head_mismatch", "ledger.head",
			fmt.Sprintf("the receipt says head %s, the last line hashes to %s", h, scan.Head)))
		// Section 8 step 7: at the last line read; with no line read, no seq or offset.
		if scan.Events > 0 {
			v.Seq = ptr(int64(scan.Events) - 1)
			if scan.LastOffset >= 0 {
				v.Offset = ptr(scan.LastOffset)
			}
		}
		return v, nil
	}
	if b, _ := claimed.Get("bytes").Count(); b != scan.Size {
		return withFigures(failed("bytes_mismatch", "ledger.bytes",
			fmt.Sprintf("the receipt says %d bytes, the ledger has %d", b, scan.Size))), nil
	}
	if e := scan.Event; e != nil {
		v := withFigures(failed(e.Code, "", e.Detail))
		v.Seq, v.Offset = ptr(int64(e.Seq)), ptr(int64(e.Offset))
		return v, nil
	}
	if p, what, found := evidenceProblem(evidence, scan.Tally, scan.Events); found {
		return withFigures(failed("evidence_mismatch", p, p+": "+what)), nil
	}
	derivedOpen := scan.Tally.OpenCalls()
	if len(derivedOpen.Items) > 0 && evidence.Get("ledger_complete").B {
		first := derivedOpen.Items[0]
		seq, _ := first.Get("seq").Count()
		v := withFigures(failed("open_call", "ops.open_calls", fmt.Sprintf(
			"ops.open_calls: call %s (model.request at seq %d) has no closing event, and the receipt says the ledger is complete",
			Show(first.Get("call_id")), seq)))
		v.Seq = ptr(int64(seq))
		return v, nil
	}
	claimedOpen := receipt.Get("ops").Get("open_calls")
	if claimedOpen == nil {
		claimedOpen = &Value{Kind: Array}
	}
	var ignored []string
	if p, what, found := firstDifference(claimedOpen, derivedOpen, "ops.open_calls", &ignored); found {
		return withFigures(failed("open_call", p, p+": "+what)), nil
	}
	claims := scan.Tally.Claims()
	compared := asClaimed(receipt, claims)
	var unbackedPaths []string
	for _, c := range claimChecks {
		if p, what, found := firstDifference(receipt.Get(c.key), compared.Get(c.key), c.key, &unbackedPaths); found {
			return withFigures(failed(c.code, p, p+": "+what)), nil
		}
	}
	// Section 7.6: absent means no request was marked.
	claimedRetries := receipt.Get("ops").Get("client_retries")
	if claimedRetries == nil {
		claimedRetries = newObject().Set("marked", num(0)).Set("retries", num(0)).Set("by_attempt", newObject())
	}
	if p, what, found := firstDifference(claimedRetries, scan.Tally.ClientRetries(), "ops.client_retries", &ignored); found {
		return withFigures(failed("client_retries_mismatch", p, p+": "+what)), nil
	}
	claimedSnapshot := receipt.Get("snapshot") // section 7.7: absent means []
	if claimedSnapshot == nil {
		claimedSnapshot = &Value{Kind: Array}
	}
	if p, what, found := firstDifference(claimedSnapshot, scan.Tally.Snapshots(), "snapshot", &unbackedPaths); found {
		return withFigures(failed("snapshot_mismatch", p, p+": "+what)), nil
	}
	// Section 7.8: absent means the cache was never consulted.
	claimedCache := receipt.Get("ops").Get("cache")
	if claimedCache == nil {
		claimedCache = newObject().Set("hits", num(0)).Set("misses", num(0)).Set("stored", num(0)).
			Set("refused_by_reason", newObject()).Set("saved_nusd", num(0))
	}
	if p, what, found := firstDifference(claimedCache, scan.Tally.Cache(), "ops.cache", &ignored); found {
		return withFigures(failed("cache_mismatch", p, p+": "+what)), nil
	}
	if p, what, found := replayProblem(receipt, scan.Tally, &unbackedPaths); found {
		return withFigures(failed("replay_mismatch", p, p+": "+what)), nil
	}
	if p, what, found := fleetProblem(receipt, scan.Tally, &unbackedPaths); found {
		return withFigures(failed("fleet_mismatch", p, p+": "+what)), nil
	}
	v = withFigures(&Verdict{OK: true, Claims: claims, Unbacked: unbackedPaths,
		Complete: evidence.Get("ledger_complete").B, TailBytes: tailBytes})
	return v, nil
}

// evidenceProblem: the first rule of section 7.4 that ops.evidence breaks.
func evidenceProblem(e *Value, t *Tally, events uint64) (string, string, bool) {
	const path = "ops.evidence"
	complete := e.Get("ledger_complete").B
	unwritten, _ := e.Get("unwritten_events").Count()
	first := e.Get("first_failing_seq")
	failures, _ := e.Get("write_failures").Count()
	says := fmt.Sprintf("the receipt says %v", complete)
	if complete != (unwritten == 0) {
		return path + ".ledger_complete", fmt.Sprintf("%s with %d unwritten events", says, unwritten), true
	}
	if complete && failures != 0 {
		return path + ".write_failures", fmt.Sprintf("the receipt says %d with ledger_complete true", failures), true
	}
	if complete && !first.IsNull() {
		return path + ".first_failing_seq", "the receipt says " + first.Str + " with ledger_complete true", true
	}
	if !complete && first.IsNull() {
		return path + ".first_failing_seq", "the receipt says null with ledger_complete false", true
	}
	if n, ok := first.Count(); ok && n > events {
		return path + ".first_failing_seq", fmt.Sprintf("%d is beyond the ledger's %d events", n, events), true
	}
	if x := e.Get("unverified_tail"); complete && x != nil && x.B {
		return path + ".unverified_tail", "the receipt says true with ledger_complete true", true
	}
	if byType := e.Get("unwritten_by_type"); byType != nil {
		var sum uint64
		for _, m := range byType.Members {
			c, _ := m.Val.Count()
			sum = add(sum, c)
		}
		if sum != unwritten {
			return path + ".unwritten_by_type", fmt.Sprintf(
				"the receipt's types add up to %d, not its %d unwritten events", sum, unwritten), true
		}
	}
	var unrecorded uint64
	if x := e.Get("unrecorded_calls"); x != nil {
		unrecorded, _ = x.Count()
	}
	if complete && unrecorded != 0 {
		return path + ".unrecorded_calls", fmt.Sprintf("the receipt says %d with ledger_complete true", unrecorded), true
	}
	if unrecorded > unwritten {
		return path + ".unrecorded_calls", fmt.Sprintf(
			"the receipt says %d, above its %d unwritten events", unrecorded, unwritten), true
	}
	if t.end != nil {
		said := t.end.evidence
		for _, key := range append(append([]string(nil), evidenceFields...), evidenceExtra...) {
			theirs := said.Get(key)
			if theirs == nil {
				continue // a session.end from before the member: nothing to hold it to
			}
			ours := e.Get(key)
			if ours == nil {
				return path + "." + key, "the receipt omits it; session.end says " + Show(theirs), true
			}
			if !Equal(ours, theirs) {
				return path + "." + key, "the receipt says " + Show(ours) + ", session.end " + Show(theirs), true
			}
		}
	}
	if complete && t.start == nil {
		return path + ".ledger_complete", says + ", but the ledger has no session.start", true
	}
	if complete && t.end == nil {
		return path + ".ledger_complete", says + ", but the ledger has no session.end", true
	}
	if t.gaps > 0 {
		if complete {
			return path + ".ledger_complete", fmt.Sprintf("%s, but the ledger has %d evidence.gap", says, t.gaps), true
		}
		if unwritten < t.lost {
			return path + ".unwritten_events", fmt.Sprintf(
				"the receipt says %d, below the %d the evidence.gap events lost", unwritten, t.lost), true
		}
		if n, ok := first.Count(); !ok || n != *t.firstGap {
			return path + ".first_failing_seq", fmt.Sprintf(
				"the receipt says %s, the first evidence.gap %d", Show(first), *t.firstGap), true
		}
	}
	return "", "", false
}
