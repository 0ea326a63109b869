// docket-verify checks a docket-receipt-1 receipt against its ledger, as
// spec/docket-receipt-1.md says, independently of the Python reference
// implementation: `docket-verify RECEIPT [--ledger LEDGER] [--json]`.
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

const usage = "usage: docket-verify RECEIPT [--ledger LEDGER] [--json]"

func main() {
	// Each line's values are garbage once folded; collecting less often is
	// most of the speed, and memory stays bounded by the longest line.
	debug.SetGCPercent(400)
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	var receipt, ledger string
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
	verdict, ierr := Verify(receipt, ledger)
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
