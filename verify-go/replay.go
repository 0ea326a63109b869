package main

// The receipt's `replay_of` (spec section 7.9): the recorded run a `docket replay`
// run was served from, as its session.start records it. Absent from the receipt:
// not a replay. Without a session.start it is unbacked when stated, and nothing
// when not.

func init() {
	receiptShape.fields["replay_of"] = opt(obj(map[string]*shape{"run_id": isStr, "head": isHex}))
}

// replayOfOrNull: session.start's replay_of, checked (section 7.9), or null.
func replayOfOrNull(v *Value, where string) *Value {
	if v.IsNull() {
		return &Value{Kind: Null}
	}
	object(v, where)
	if len(v.Members) != 2 || v.Get("run_id") == nil || v.Get("head") == nil {
		bad("%s must have exactly run_id and head", where)
	}
	text(v.Get("run_id"), where+".run_id")
	if head := v.Get("head"); head.Kind != String || !isHex64(head.Str) {
		bad("%s.head must be 64 lowercase hex digits", where)
	}
	return v
}

// replayProblem: the first difference between the receipt's replay_of and the ledger's.
func replayProblem(receipt *Value, t *Tally, unbacked *[]string) (string, string, bool) {
	stated := receipt.Get("replay_of")
	if t.start == nil {
		if stated != nil {
			*unbacked = append(*unbacked, "replay_of")
		}
		return "", "", false
	}
	if stated == nil {
		stated = &Value{Kind: Null}
	}
	return firstDifference(stated, t.start.replayOf, "replay_of", unbacked)
}
