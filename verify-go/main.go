// docket-verify checks a docket-receipt-1 receipt against its ledger, as
// spec/docket-receipt-1.md says, independently of the Python reference
// implementation: `docket-verify RECEIPT [--ledger LEDGER] [--json]`; with
// `docket-verify RUN --attestation ENVELOPE --pubkey KEY [--json]` it first checks a
// signed DSSE envelope over the run's files (spec/docket-attestation-1.md).
//
// Exit 0: every claim holds; 1: a check failed; 2: verification could not
// start (an input error), or the command line was wrong.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
)

const usage = "usage: docket-verify RECEIPT [--ledger LEDGER] [--json] | RUN --attestation ENVELOPE --pubkey KEY [--json]"

func main() {
	// Each line's values are garbage once folded; collecting less often is
	// most of the speed, and memory stays bounded by the longest line.
	debug.SetGCPercent(400)
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	var receipt, ledger, attestation, pubkey string
	asJSON, haveReceipt, haveLedger := false, false, false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--json":
			asJSON = true
		case a == "-h" || a == "--help":
			fmt.Println(usage)
			return 0
		case a == "--ledger" || strings.HasPrefix(a, "--ledger="):
			if haveLedger {
				return usageError("--ledger given twice")
			}
			if a == "--ledger" {
				if i+1 >= len(args) {
					return usageError("--ledger needs a path")
				}
				i++
				ledger = args[i]
			} else {
				ledger = strings.TrimPrefix(a, "--ledger=")
			}
			if ledger == "" {
				return usageError("--ledger needs a path")
			}
			haveLedger = true
		case a == "--attestation" || a == "--pubkey" || strings.HasPrefix(a, "--attestation=") || strings.HasPrefix(a, "--pubkey="):
			name, value := a, ""
			if eq := strings.IndexByte(a, '='); eq >= 0 {
				name, value = a[:eq], a[eq+1:]
			} else {
				if i+1 >= len(args) {
					return usageError(a + " needs a path")
				}
				i++
				value = args[i]
			}
			if value == "" {
				return usageError(name + " needs a path")
			}
			if name == "--attestation" {
				attestation = value
			} else {
				pubkey = value
			}
		case a == "--":
			if i+1 < len(args) && !haveReceipt {
				receipt, haveReceipt = args[i+1], true
				i++
			}
			if i+1 < len(args) {
				return usageError("unexpected argument " + args[i+1])
			}
		case strings.HasPrefix(a, "-") && a != "-":
			return usageError("unknown option " + a)
		default:
			if haveReceipt {
				return usageError("unexpected argument " + a)
			}
			receipt, haveReceipt = a, true
		}
	}
	if !haveReceipt {
		return usageError("no receipt given")
	}
	if (attestation == "") != (pubkey == "") {
		return usageError("--attestation and --pubkey go together")
	}
	if attestation != "" {
		if haveLedger {
			return usageError("--ledger is not taken with --attestation: the subjects name the ledger")
		}
		a, v, ierr := VerifyAttested(receipt, attestation, pubkey)
		if ierr == nil && v.OK {
			return emitAttested(a, asJSON)
		}
		return emit(v, ierr, asJSON)
	}
	verdict, ierr := Verify(receipt, ledger)
	return emit(verdict, ierr, asJSON)
}

func emit(verdict *Verdict, ierr *InputError, asJSON bool) int {
	if asJSON {
		out, _ := json.Marshal(report(verdict, ierr))
		fmt.Println(string(out))
	} else if ierr != nil {
		fmt.Fprintf(os.Stderr, "docket-verify: %s\n", oneLine(ierr.Error()))
	} else {
		fmt.Println(oneLine(summary(verdict)))
	}
	switch {
	case ierr != nil:
		return 2
	case verdict.OK:
		return 0
	}
	return 1
}

// emitAttested: an envelope and its run that passed every check.
func emitAttested(a *Attested, asJSON bool) int {
	line := oneLine(attestedLine(a))
	if !asJSON {
		fmt.Println(line)
		return 0
	}
	out := map[string]interface{}{
		"verdict": "ok", "exit": 0, "code": nil, "seq": nil, "offset": nil, "field": nil,
		"detail": line, "events": nil, "head": nil, "bytes": nil, "unbacked": []string{},
		"attestation": map[string]interface{}{"kind": a.Kind, "keyid": a.KeyID, "subjects": a.Subjects},
	}
	if v := a.Receipt; v != nil {
		out["events"], out["head"], out["bytes"] = v.Events, v.Head, v.Bytes
		out["complete"], out["tail_bytes"] = v.Complete, v.TailBytes
		if v.Unbacked != nil {
			out["unbacked"] = v.Unbacked
		}
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	return 0
}

func usageError(msg string) int {
	fmt.Fprintf(os.Stderr, "docket-verify: %s (%s)\n", msg, usage)
	return 2
}

// oneLine keeps the promise of one line: a name from a file may hold a newline.
func oneLine(s string) string {
	return strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(s)
}

func summary(v *Verdict) string {
	if !v.OK {
		var where []string
		if v.Seq != nil {
			where = append(where, fmt.Sprintf("seq %d", *v.Seq))
		}
		if v.Offset != nil {
			where = append(where, fmt.Sprintf("byte %d", *v.Offset))
		}
		at := ""
		if len(where) > 0 {
			at = " at " + strings.Join(where, ", ")
		}
		return fmt.Sprintf("FAIL %s%s: %s", v.Code, at, v.Detail)
	}
	t := v.Claims.Get("totals")
	line := fmt.Sprintf("ok: %d events, head %s, %d bytes; %s model calls, %s input + %s output tokens, $%s; ",
		v.Events, v.Head, v.Bytes, t.Get("model_calls").Str, t.Get("input_tokens").Str,
		t.Get("output_tokens").Str, t.Get("usd").Str)
	if v.Complete {
		line += "ledger complete"
	} else {
		line += "ledger incomplete (disclosed)"
	}
	if v.TailBytes > 0 {
		line += fmt.Sprintf("; %d bytes past the record, from a write that failed and could not be cut back (disclosed, not verified)", v.TailBytes)
	}
	if len(v.Unbacked) > 0 {
		line += "; not backed by the ledger: " + strings.Join(v.Unbacked, ", ")
	}
	return line
}

// report is --json's object: the manifest's names (spec section 12) for
// the verdict, plus detail and, once the chain was read, its figures.
func report(v *Verdict, ierr *InputError) map[string]interface{} {
	out := map[string]interface{}{
		"verdict": "input_error", "exit": 2, "code": nil, "seq": nil, "offset": nil,
		"field": nil, "detail": "", "events": nil, "head": nil, "bytes": nil, "unbacked": []string{},
	}
	if ierr != nil {
		out["code"], out["detail"] = ierr.Code, ierr.Msg
		return out
	}
	if v.OK {
		out["verdict"], out["exit"], out["detail"] = "ok", 0, summary(v)
		out["complete"] = v.Complete
		out["tail_bytes"] = v.TailBytes
		if v.Unbacked != nil {
			out["unbacked"] = v.Unbacked
		}
	} else {
		out["verdict"], out["exit"], out["code"], out["detail"] = "fail", 1, v.Code, v.Detail
		if v.Seq != nil {
			out["seq"] = *v.Seq
		}
		if v.Offset != nil {
			out["offset"] = *v.Offset
		}
		if v.Field != "" {
			out["field"] = v.Field
		}
	}
	if v.Figures {
		out["events"], out["head"], out["bytes"] = v.Events, v.Head, v.Bytes
	}
	return out
}
