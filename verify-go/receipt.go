package main

// The receipt's shape (spec section 6.2) and section 7.3's paths and first
// difference.

import (
	"regexp"
	"sort"
	"strconv"
)

const Format = "docket-receipt-1"

// A shape is a check on one value: a leaf check, a fixed object, a map or a list.
type shape struct {
	leaf     func(*Value) string // "" when the value is right, else what it must be
	fields   map[string]*shape   // a fixed object
	optional bool                // the member may be absent
	mapOf    *shape              // an object whose names the data chooses
	listOf   *shape
}

func leaf(f func(*Value) string) *shape { return &shape{leaf: f} }
func opt(s *shape) *shape               { c := *s; c.optional = true; return &c }

var usdPattern = regexp.MustCompile(`^(0|[1-9][0-9]*)\.[0-9]{9}$`)

var (
	isStr = leaf(func(v *Value) string {
		if v.Kind == String {
			return ""
		}
		return "must be a string"
	})
	isStrOrNull = leaf(func(v *Value) string {
		if v.Kind == String || v.Kind == Null {
			return ""
		}
		return "must be a string or null"
	})
	isCount = leaf(func(v *Value) string {
		if _, ok := v.Count(); ok {
			return ""
		}
		return "must be an integer from 0 to 2^53-1"
	})
	isCountOrNull = leaf(func(v *Value) string {
		if _, ok := v.Count(); ok || v.Kind == Null {
			return ""
		}
		return "must be an integer from 0 to 2^53-1 or null"
	})
	isIntOrNull = leaf(func(v *Value) string {
		if _, ok := v.SignedInt(); ok || v.Kind == Null {
			return ""
		}
		return "must be an integer or null"
	})
	isBool = leaf(func(v *Value) string {
		if v.Kind == Bool {
			return ""
		}
		return "must be true or false"
	})
	isHex = leaf(func(v *Value) string {
		if v.Kind == String && isHex64(v.Str) {
			return ""
		}
		return "must be 64 lowercase hex digits"
	})
	isUSD = leaf(func(v *Value) string {
		if v.Kind == String && usdPattern.MatchString(v.Str) {
			return ""
		}
		return "must be a decimal string with 9 places"
	})
	isPrice = leaf(func(v *Value) string {
		if v.Kind == String && pricePattern.MatchString(v.Str) {
			return ""
		}
		return "must be a decimal string with at most 3 decimals"
	})
	isRelativePath = leaf(func(v *Value) string {
		if v.Kind == String && v.Str != "" && v.Str[0] != '/' && !containsByte(v.Str, '\\') {
			return ""
		}
		return "must be a relative path with / separators"
	})
	isObject = leaf(func(v *Value) string {
		if v.Kind == Object {
			return ""
		}
		return "must be an object"
	})
	isObjectOrNull = leaf(func(v *Value) string {
		if v.Kind == Object || v.Kind == Null {
			return ""
		}
		return "must be an object or null"
	})
	isAnything = leaf(func(*Value) string { return "" })
)

func containsByte(s string, c byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return true
		}
	}
	return false
}

func obj(fields map[string]*shape) *shape { return &shape{fields: fields} }

func counterShape(byModel bool) *shape {
	f := map[string]*shape{"usd": isUSD}
	for _, n := range counterNames {
		f[n] = isCount
	}
	if byModel {
		f["by_model"] = &shape{mapOf: counterShape(false)}
	}
	return obj(f)
}

// optionalClaims: section 6.5's members of totals and faults; absent, not claimed.
var optionalClaims = [][2]string{
	{"totals", "refused_by_rule"}, {"totals", "by_provider"}, {"totals", "by_upstream"},
	{"totals", "breaker_transitions"}, {"faults", "by_layer"},
}

func totalsShape() *shape {
	s := counterShape(true)
	s.fields["refused_by_rule"] = opt(&shape{mapOf: isCount})
	s.fields["by_provider"] = opt(&shape{mapOf: counterShape(false)})
	s.fields["by_upstream"] = opt(&shape{mapOf: counterShape(false)})
	s.fields["breaker_transitions"] = opt(&shape{mapOf: &shape{mapOf: &shape{mapOf: isCount}}})
	return s
}

// asClaimed: the derived claims less the optional ones the receipt does not make
// (section 6.5: a receipt from before them still verifies).
func asClaimed(receipt, claims *Value) *Value {
	out := claims
	for _, pm := range optionalClaims {
		parent := out.Get(pm[0])
		if receipt.Get(pm[0]).Has(pm[1]) || parent == nil || parent.Kind != Object {
			continue
		}
		less := newObject()
		for _, m := range parent.Members {
			if m.Key != pm[1] {
				less.Set(m.Key, m.Val)
			}
		}
		copied := newObject()
		for _, m := range out.Members {
			if m.Key == pm[0] {
				copied.Set(m.Key, less)
			} else {
				copied.Set(m.Key, m.Val)
			}
		}
		out = copied
	}
	return out
}

func firstCapShape() *shape {
	return obj(map[string]*shape{"cap": isStr, "seq": isCount, "limit": isAnything, "observed": isAnything})
}

var receiptShape = obj(map[string]*shape{
	"format":         isStr,
	"docket_version": isStr,
	"run_id":         isStr,
	"started_at":     isStr,
	"ended_at":       isStr,
	"duration_ms":    isCount,
	"exit":           obj(map[string]*shape{"status": isIntOrNull, "reason": isStr, "cap": isStrOrNull}),
	"ledger":         obj(map[string]*shape{"file": isRelativePath, "events": isCount, "head": isHex, "bytes": isCount}),
	"totals":         totalsShape(),
	"pricing": obj(map[string]*shape{
		"table_date": isStrOrNull,
		"provenance": isStrOrNull,
		"unit_prices": &shape{mapOf: obj(map[string]*shape{
			"input": isPrice, "output": isPrice, "cached_input": isPrice})},
	}),
	"caps": obj(map[string]*shape{
		"limits":   isObject,
		"warnings": &shape{listOf: firstCapShape()},
		"breaches": &shape{listOf: firstCapShape()},
	}),
	"policy_digest": isStr,
	"ops": obj(map[string]*shape{
		"evidence": obj(map[string]*shape{
			"ledger_complete":   isBool,
			"unwritten_events":  isCount,
			"first_failing_seq": isCountOrNull,
			"write_failures":    isCount,
			"unrecorded_calls":  opt(isCount),
			"last_error":        opt(isStrOrNull),
			"unverified_tail":   opt(isBool),
			"unwritten_by_type": opt(&shape{mapOf: isCount}),
		}),
		"open_calls": opt(&shape{listOf: obj(map[string]*shape{"call_id": isStr, "seq": isCount})}),
		"client_retries": opt(obj(map[string]*shape{
			"marked": isCount, "retries": isCount, "by_attempt": &shape{mapOf: isCount},
		})),
		"cache": opt(obj(map[string]*shape{
			"hits": isCount, "misses": isCount, "stored": isCount,
			"refused_by_reason": &shape{mapOf: isCount}, "saved_nusd": isCount,
		})),
	}),
	"faults": obj(map[string]*shape{
		"seed":     isIntOrNull,
		"plan":     isObjectOrNull,
		"injected": isCount,
		"by_fault": &shape{mapOf: isCount},
		"by_layer": opt(&shape{mapOf: isCount}),
	}),
})

// plainName: a name written after a `.` in a path; others are ["name"].
func plainName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func joinName(path, k string) string {
	if plainName(k) {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	return path + "[" + quote(k) + "]"
}

func joinIndex(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

func sortedKeys(v *Value) []string {
	keys := v.Names()
	sort.Strings(keys)
	return keys
}

func unionKeys(a []string, b []string) []string {
	seen := map[string]bool{}
	var keys []string
	for _, list := range [][]string{a, b} {
		for _, k := range list {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys
}

// shapeProblem: the first place (path, problem) where v departs from s.
func shapeProblem(v *Value, s *shape, path string) (string, string, bool) {
	switch {
	case s.fields != nil:
		if v.Kind != Object {
			if path == "" {
				path = "receipt"
			}
			return path, "must be an object", true
		}
		names := make([]string, 0, len(s.fields))
		for k := range s.fields {
			names = append(names, k)
		}
		for _, k := range unionKeys(v.Names(), names) {
			where := joinName(path, k)
			member, known := s.fields[k]
			if !known {
				return where, "is not a field of " + Format, true
			}
			got := v.Get(k)
			if got == nil {
				if member.optional {
					continue
				}
				return where, "is missing", true
			}
			if p, what, found := shapeProblem(got, member, where); found {
				return p, what, true
			}
		}
		return "", "", false
	case s.mapOf != nil:
		if v.Kind != Object {
			return path, "must be an object", true
		}
		for _, k := range sortedKeys(v) {
			if p, what, found := shapeProblem(v.Get(k), s.mapOf, joinName(path, k)); found {
				return p, what, true
			}
		}
		return "", "", false
	case s.listOf != nil:
		if v.Kind != Array {
			return path, "must be an array", true
		}
		for i, it := range v.Items {
			if p, what, found := shapeProblem(it, s.listOf, joinIndex(path, i)); found {
				return p, what, true
			}
		}
		return "", "", false
	}
	if what := s.leaf(v); what != "" {
		return path, what, true
	}
	return "", "", false
}

// firstDifference compares a claim with its derivation (section 7.3),
// skipping unbacked derivations and listing their paths in *unbacked.
func firstDifference(claimed, derived *Value, path string, unbackedPaths *[]string) (string, string, bool) {
	if derived.Kind == Unbacked {
		*unbackedPaths = append(*unbackedPaths, path)
		return "", "", false
	}
	if claimed.Kind == Object && derived.Kind == Object {
		for _, k := range unionKeys(claimed.Names(), derived.Names()) {
			where := joinName(path, k)
			c, d := claimed.Get(k), derived.Get(k)
			if d == nil {
				return where, "the receipt claims " + Show(c) + "; the ledger has none", true
			}
			if c == nil {
				return where, "the receipt omits it; the ledger has " + Show(d), true
			}
			if p, what, found := firstDifference(c, d, where, unbackedPaths); found {
				return p, what, true
			}
		}
		return "", "", false
	}
	if claimed.Kind == Array && derived.Kind == Array {
		n := min(len(claimed.Items), len(derived.Items))
		for i := 0; i < n; i++ {
			if p, what, found := firstDifference(claimed.Items[i], derived.Items[i], joinIndex(path, i), unbackedPaths); found {
				return p, what, true
			}
		}
		if len(claimed.Items) != len(derived.Items) {
			return joinIndex(path, n), "the receipt lists " + strconv.Itoa(len(claimed.Items)) +
				", the ledger has " + strconv.Itoa(len(derived.Items)), true
		}
		return "", "", false
	}
	if Equal(claimed, derived) {
		return "", "", false
	}
	return path, "the receipt says " + Show(claimed) + ", the ledger says " + Show(derived), true
}
