package main

// The tally (spec section 5): a fold over the events that re-derives the
// receipt's claims. Only the members section 5 lists are read; every other
// member and every other event type is counted and otherwise ignored.

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// counters, in the receipt's order of section 6.4 (usd is rendered from cost).
const (
	cCalls = iota
	cResponses
	cErrors
	cRefused
	cInput
	cOutput
	cCached
	cCost
	cUnpriced
	nCounters
)

var counterNames = [nCounters]string{"model_calls", "responses", "errors", "refused",
	"input_tokens", "output_tokens", "cached_tokens", "cost_nusd", "unpriced_calls"}

var pricePattern = regexp.MustCompile(`^(0|[1-9][0-9]{0,8})(\.[0-9]{1,3})?$`)

// saturate is above every integer a receipt may state (2^53-1), so a sum
// that reaches it can never equal a claim, and uint64 never wraps.
const saturate = uint64(1) << 62

func add(a, b uint64) uint64 {
	if a+b > saturate {
		return saturate
	}
	return a + b
}

type firstCap struct {
	cap             string
	seq             uint64
	limit, observed *Value
}

type openCall struct {
	callID   string
	seq      uint64
	open     bool
	upstream *[nCounters]uint64 // the counters of the base_url its model.request named
}

type sessionStart struct {
	runID, version, digest, ts *Value
	tableDate, provenance      *Value
	limits                     *Value
	seed                       *Value // integer or null
	plan                       *Value // object or null
	replayOf                   *Value // object or null (replay.go)
	fleet                      *Value // object or null (fleet.go)
	mono                       uint64
}

type sessionEnd struct {
	reason, status, cap, ts *Value
	evidence                *Value // the evidence object, as checked
	mono                    uint64
}

type Tally struct {
	snapshots snapshotFold // the receipt's `snapshot` (snapshot.go)
	events    uint64
	start     *sessionStart
	end       *sessionEnd
	models    map[string]*[nCounters]uint64
	prices    map[string][3]string
	warnings  map[string]*firstCap
	breaches  map[string]*firstCap
	faults    map[string]uint64
	faultSeed *Value
	gaps      uint64
	lost      uint64
	firstGap  *uint64
	calls     []openCall        // every model.request with a call_id that opened a call, in seq order
	open      map[string]int    // call_id -> index in calls, while open
	attempts  map[uint64]uint64 // client_attempt -> model.request events carrying it (section 7.6)
	// The response cache (section 7.8): hits, misses, stored, saved_nusd; refusals by reason.
	cache        [4]uint64
	cacheRefused map[string]uint64
	// Section 6.5: refusals by rule, counters by provider and by base URL, breaker
	// transitions (upstream -> from -> to), faults by layer. Counts are held by pointer
	// so that a count goes up by a lookup: assigning to a map re-stores its key, and a
	// key read from a line would keep the whole line alive.
	refusals  map[string]*uint64
	providers map[string]*[nCounters]uint64
	upstreams map[string]*[nCounters]uint64
	breaker   map[string]map[string]map[string]*uint64
	layers    map[string]*uint64
	fleet     fleetFold // the receipt's `fleet` (fleet.go)
}

// guardRefusals: the refusal events that are one guard's, and the rule each counts under.
var guardRefusals = map[string]string{
	"x-docket.rate-limited": "rate_limit",
	"x-docket.breaker-open": "breaker",
	"load.shed":             "load_shed",
	"net.denied":            "egress",
}

// own: a copy of a string read from a line, for a map key that outlives it.
func own(s string) string { return string([]byte(s)) }

func bump(m map[string]*uint64, k string, n uint64) {
	if c := m[k]; c != nil {
		*c = add(*c, n)
		return
	}
	c := n
	m[own(k)] = &c
}

func countersIn(m map[string]*[nCounters]uint64, k string) *[nCounters]uint64 {
	c := m[k]
	if c == nil {
		c = new([nCounters]uint64)
		m[own(k)] = c
	}
	return c
}

// textOrEmpty: a string member, "" when absent or null.
func textOrEmpty(e *Value, name, where string) string {
	v := e.Get(name)
	if v.IsNull() {
		return ""
	}
	return text(v, where).Str
}

func NewTally() *Tally {
	return &Tally{
		models:   map[string]*[nCounters]uint64{},
		prices:   map[string][3]string{},
		warnings: map[string]*firstCap{},
		breaches: map[string]*firstCap{},
		faults:   map[string]uint64{},
		open:     map[string]int{},
		attempts: map[uint64]uint64{},

		refusals:  map[string]*uint64{},
		providers: map[string]*[nCounters]uint64{},
		upstreams: map[string]*[nCounters]uint64{},
		breaker:   map[string]map[string]map[string]*uint64{},
		layers:    map[string]*uint64{},

		cacheRefused: map[string]uint64{},
	}
}

type tallyError string

func bad(format string, args ...interface{}) { panic(tallyError(fmt.Sprintf(format, args...))) }

func count(v *Value, where string) uint64 {
	n, ok := v.Count()
	if !ok {
		bad("%s must be an integer from 0 to 2^53-1", where)
	}
	return n
}

func text(v *Value, where string) *Value {
	if v == nil || v.Kind != String {
		bad("%s must be a string", where)
	}
	return v
}

// digestOrNull: a SHA-256 in 64 lowercase hex digits, or absent/null (the cache's digests).
func digestOrNull(v *Value, where string) *Value {
	if v.IsNull() {
		return null
	}
	if v.Kind != String || !isHex64(v.Str) {
		bad("%s must be 64 lowercase hex digits or absent", where)
	}
	return v
}

func textOrNull(v *Value, where string) *Value {
	if v.IsNull() {
		return null
	}
	return text(v, where)
}

func object(v *Value, where string) *Value {
	if v == nil || v.Kind != Object {
		bad("%s must be an object", where)
	}
	return v
}

func seedOrNull(v *Value, where string) *Value {
	if v.IsNull() {
		return null
	}
	if _, ok := v.SignedInt(); !ok {
		bad("%s must be an integer or null", where)
	}
	return v
}

func modelOf(e *Value, kind string) string {
	m := e.Get("model")
	if m.IsNull() {
		return "" // a call whose model is not known (a refusal before the body was read)
	}
	return text(m, kind+".model").Str
}

// callID: the call an event opens or closes; "" with ok false when it has none.
func callID(e *Value, kind string) (string, bool) {
	c := e.Get("call_id")
	if c.IsNull() {
		return "", false
	}
	return text(c, kind+".call_id").Str, true
}

func usageOf(e *Value, kind string) (uint64, uint64, uint64) {
	u := e.Get("usage")
	if u.IsNull() {
		return 0, 0, 0
	}
	where := kind + ".usage"
	object(u, where)
	get := func(name string) uint64 {
		v := u.Get(name)
		if v == nil {
			return 0
		}
		return count(v, where+"."+name)
	}
	return get("input_tokens"), get("output_tokens"), get("cached_tokens")
}

var evidenceFields = []string{"ledger_complete", "unwritten_events", "first_failing_seq", "write_failures"}
var evidenceExtra = []string{"unrecorded_calls", "last_error", "unverified_tail", "unwritten_by_type"}

func checkEvidence(v *Value, where string) *Value {
	object(v, where)
	for _, k := range evidenceFields {
		if !v.Has(k) {
			bad("%s lacks %s", where, k)
		}
	}
	if v.Get("ledger_complete").Kind != Bool {
		bad("%s.ledger_complete must be true or false", where)
	}
	count(v.Get("unwritten_events"), where+".unwritten_events")
	count(v.Get("write_failures"), where+".write_failures")
	if !v.Get("first_failing_seq").IsNull() {
		count(v.Get("first_failing_seq"), where+".first_failing_seq")
	}
	if x := v.Get("unrecorded_calls"); x != nil {
		count(x, where+".unrecorded_calls")
	}
	if x := v.Get("last_error"); x != nil {
		textOrNull(x, where+".last_error")
	}
	if x := v.Get("unverified_tail"); x != nil && x.Kind != Bool {
		bad("%s.unverified_tail must be true or false", where)
	}
	if x := v.Get("unwritten_by_type"); x != nil {
		object(x, where+".unwritten_by_type")
		for _, m := range x.Members {
			count(m.Val, where+".unwritten_by_type."+m.Key)
		}
	}
	return v
}

// Add folds one event (a line the chain accepted). It returns "" or why the
// event is malformed_event; after the first such event the caller stops
// folding, since the verdict is then that event whatever follows.
func (t *Tally) Add(e *Value) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			te, ok := r.(tallyError)
			if !ok {
				panic(r)
			}
			msg = string(te)
		}
	}()
	kind := e.Get("type").Str
	if t.end != nil {
		bad("%s after session.end, which must be the last event", kind)
	}
	switch kind {
	case "session.start":
		t.onStart(e)
	case "session.end":
		t.onEnd(e)
	case "model.request":
		t.onRequest(e)
	case "model.response":
		t.onCharge(e, kind, true)
	case "model.error":
		t.onCharge(e, kind, false)
	case "policy.denied":
		model := modelOf(e, kind)
		provider := textOrEmpty(e, "provider", "policy.denied.provider")
		rule, code := "policy", "" // none named
		if r := e.Get("rule"); !r.IsNull() {
			rule = text(r, "policy.denied.rule").Str
			for i := 0; i < len(rule); i++ {
				if rule[i] == '.' { // caps.max_usd counts under caps
					rule, code = rule[:i], rule[i+1:]
					break
				}
			}
		}
		t.counters(model)[cRefused]++
		countersIn(t.providers, provider)[cRefused]++
		bump(t.refusals, rule, 1)
		if rule == "fleet" { // the same refusal, by the fleet's code (section 7.10)
			t.fleet.onRefused(code)
		}
	case "fleet.lease":
		t.fleet.onLease(e)
	case "fleet.store":
		t.fleet.onStore()
	case "x-docket.rate-limited", "x-docket.breaker-open", "load.shed", "net.denied":
		bump(t.refusals, guardRefusals[kind], 1)
	case "breaker.state":
		upstream := textOrEmpty(e, "upstream", "breaker.state.upstream")
		from := text(e.Get("from"), "breaker.state.from").Str
		to := text(e.Get("to"), "breaker.state.to").Str
		froms := t.breaker[upstream]
		if froms == nil {
			froms = map[string]map[string]*uint64{}
			t.breaker[own(upstream)] = froms
		}
		tos := froms[from]
		if tos == nil {
			tos = map[string]*uint64{}
			froms[own(from)] = tos
		}
		bump(tos, to, 1)
	case "cap.warning", "cap.exceeded":
		t.onCap(e, kind)
	case "fault.injected":
		t.onFault(e)
	case "evidence.gap":
		t.onGap(e)
	case "snapshot.taken", "snapshot.changes", "snapshot.restored":
		t.snapshots.add(e, kind) // snapshot.go
	case "cache.hit":
		saved := count(e.Get("saved_nusd"), "cache.hit.saved_nusd")
		count(e.Get("replays_seq"), "cache.hit.replays_seq")
		textOrNull(e.Get("replays_run"), "cache.hit.replays_run") // a shared store's run
		digestOrNull(e.Get("body_sha256"), "cache.hit.body_sha256")
		t.cache[0] = add(t.cache[0], 1)
		t.cache[3] = add(t.cache[3], saved)
	}
	t.events++
	return ""
}

func (t *Tally) counters(model string) *[nCounters]uint64 {
	c := t.models[model]
	if c == nil {
		c = new([nCounters]uint64)
		t.models[model] = c
	}
	return c
}

func (t *Tally) onStart(e *Value) {
	const where = "session.start"
	if t.events != 0 {
		bad("session.start must be the first event, and there is only one")
	}
	s := &sessionStart{
		runID:   text(e.Get("run_id"), where+".run_id"),
		version: text(e.Get("docket_version"), where+".docket_version"),
		digest:  text(e.Get("policy_digest"), where+".policy_digest"),
	}
	pricing := object(e.Get("pricing"), where+".pricing")
	s.tableDate = textOrNull(pricing.Get("table_date"), where+".pricing.table_date")
	s.provenance = textOrNull(pricing.Get("provenance"), where+".pricing.provenance")
	s.limits = object(e.Get("caps"), where+".caps")
	s.seed, s.plan = null, null
	if chaos := e.Get("chaos"); !chaos.IsNull() {
		object(chaos, where+".chaos")
		s.seed = seedOrNull(chaos.Get("seed"), where+".chaos.seed")
		plan := newObject()
		for _, m := range chaos.Members {
			if m.Key != "seed" {
				plan.Set(m.Key, m.Val)
			}
		}
		s.plan = plan
	}
	s.replayOf = replayOfOrNull(e.Get("replay_of"), where+".replay_of")
	s.fleet = fleetOrNull(e.Get("fleet"), where+".fleet")
	s.ts = e.Get("ts")
	s.mono, _ = e.Get("mono_ms").Count()
	t.start = s
}

func (t *Tally) onEnd(e *Value) {
	const where = "session.end"
	status := e.Get("exit_status")
	if !status.IsNull() {
		if _, ok := status.SignedInt(); !ok {
			bad("%s.exit_status must be an integer or null", where)
		}
	} else {
		status = null
	}
	end := &sessionEnd{
		reason:   text(e.Get("reason"), where+".reason"),
		status:   status,
		cap:      textOrNull(e.Get("cap"), where+".cap"),
		evidence: checkEvidence(e.Get("evidence"), where+".evidence"),
		ts:       e.Get("ts"),
	}
	end.mono, _ = e.Get("mono_ms").Count()
	// Calls refused whose refusal could not be written (the ledger full): by rule.
	if unrecorded := e.Get("refused_unrecorded"); !unrecorded.IsNull() {
		object(unrecorded, where+".refused_unrecorded")
		for _, m := range unrecorded.Members {
			count(unrecorded.Get(m.Key), where+".refused_unrecorded["+quote(m.Key)+"]")
		}
		for _, m := range unrecorded.Members {
			n, _ := unrecorded.Get(m.Key).Count()
			bump(t.refusals, m.Key, n)
		}
	}
	t.end = end
}

func (t *Tally) onRequest(e *Value) {
	id, has := callID(e, "model.request")
	attempt := e.Get("client_attempt")
	marked := !attempt.IsNull()
	var n uint64
	if marked {
		n = count(attempt, "model.request.client_attempt")
	}
	provider := textOrEmpty(e, "provider", "model.request.provider")
	baseURL := textOrEmpty(e, "base_url", "model.request.base_url")
	c := t.counters(modelOf(e, "model.request"))
	upstream := countersIn(t.upstreams, baseURL)
	c[cCalls]++
	countersIn(t.providers, provider)[cCalls]++
	upstream[cCalls]++
	if marked {
		t.attempts[n] = add(t.attempts[n], 1)
	}
	if looked := e.Get("cache"); !looked.IsNull() {
		if looked.Kind != String || looked.Str != "miss" {
			bad("model.request.cache must be \"miss\" or absent")
		}
		t.cache[1] = add(t.cache[1], 1)
	}
	checkForwarded(e)
	if has {
		if _, open := t.open[id]; !open { // a second request with an open call's id keeps the first
			seq, _ := e.Get("seq").Count()
			id = string([]byte(id)) // its own copy: a slice would keep the whole line alive
			t.open[id] = len(t.calls)
			t.calls = append(t.calls, openCall{id, seq, true, upstream})
			t.compact()
		}
	}
}

// compact drops closed calls from t.calls once they are most of it, so
// memory follows the calls in flight, not every call the run made.
func (t *Tally) compact() {
	if len(t.calls) < 1024 || len(t.calls) < 4*len(t.open) {
		return
	}
	kept := t.calls[:0]
	for _, c := range t.calls {
		if c.open {
			t.open[c.callID] = len(kept)
			kept = append(kept, c)
		}
	}
	t.calls = kept
}

func checkPrices(p *Value) [3]string {
	const where = "model.response.unit_prices"
	object(p, where)
	var out [3]string
	for i, name := range [...]string{"input", "output", "cached_input"} {
		v := p.Get(name)
		if v == nil || v.Kind != String || !pricePattern.MatchString(v.Str) {
			bad("%s.%s must be a decimal string with at most 3 decimals", where, name)
		}
		out[i] = v.Str
	}
	return out
}

func (t *Tally) onCharge(e *Value, kind string, response bool) {
	id, has := callID(e, kind)
	provider := textOrEmpty(e, "provider", kind+".provider")
	in, out, cached := usageOf(e, kind)
	model := modelOf(e, kind)
	cost := count(e.Get("cost_nusd"), kind+".cost_nusd")
	stored, refused := e.Get("cache_stored"), e.Get("cache_refused")
	if !digestOrNull(e.Get("cache_body_sha256"), kind+".cache_body_sha256").IsNull() &&
		(stored.IsNull() || stored.Kind != Bool || !stored.B) {
		bad("%s.cache_body_sha256 must be absent unless cache_stored is true", kind)
	}
	if !stored.IsNull() {
		if stored.Kind != Bool || !stored.B || !refused.IsNull() {
			bad("%s.cache_stored must be true, alone, or absent", kind)
		}
		t.cache[2] = add(t.cache[2], 1)
	} else if !refused.IsNull() {
		reason := text(refused, kind+".cache_refused").Str
		t.cacheRefused[reason] = add(t.cacheRefused[reason], 1)
	}
	priced := false
	if response {
		p := e.Get("priced")
		if p == nil || p.Kind != Bool {
			bad("model.response.priced must be true or false")
		}
		priced = p.B
		if priced {
			prices := checkPrices(e.Get("unit_prices"))
			if known, seen := t.prices[model]; seen && known != prices {
				bad("model.response.unit_prices for %q differ from an earlier response's", model)
			}
			t.prices[model] = prices
		}
	}
	var upstream *[nCounters]uint64 // its call's, else "": a call no open model.request names
	if has {
		if i, open := t.open[id]; open {
			t.calls[i].open = false
			upstream = t.calls[i].upstream
			delete(t.open, id)
		}
	}
	if upstream == nil {
		upstream = countersIn(t.upstreams, "")
	}
	for _, c := range [...]*[nCounters]uint64{t.counters(model), countersIn(t.providers, provider), upstream} {
		if response {
			c[cResponses]++
			if !priced {
				c[cUnpriced]++
			}
		} else {
			c[cErrors]++
		}
		c[cInput] = add(c[cInput], in)
		c[cOutput] = add(c[cOutput], out)
		c[cCached] = add(c[cCached], cached)
		c[cCost] = add(c[cCost], cost)
	}
}

func (t *Tally) onCap(e *Value, kind string) {
	cap := text(e.Get("cap"), kind+".cap").Str
	for _, name := range [...]string{"limit", "observed"} {
		if !e.Has(name) {
			bad("%s lacks %s", kind, name)
		}
	}
	firsts := t.warnings
	if kind == "cap.exceeded" {
		firsts = t.breaches
	}
	if _, seen := firsts[cap]; !seen {
		seq, _ := e.Get("seq").Count()
		firsts[cap] = &firstCap{cap, seq, e.Get("limit"), e.Get("observed")}
	}
}

func (t *Tally) onFault(e *Value) {
	fault := text(e.Get("fault"), "fault.injected.fault").Str
	seed := seedOrNull(e.Get("seed"), "fault.injected.seed")
	// One run, one seed: the one session.start declares, else the first fault's.
	if t.start != nil || len(t.faults) > 0 {
		expected := t.faultSeed
		if t.start != nil {
			expected = t.start.seed
		}
		if !Equal(seed, expected) {
			bad("fault.injected.seed %s is not the run's seed %s", Show(seed), Show(expected))
		}
	}
	layer := textOrEmpty(e, "target", "fault.injected.target")
	if e.Get("target").IsNull() { // no target member: the fault text's own, before its ":"
		layer = strings.TrimLeft(fault, " \t")
		if i := strings.IndexByte(layer, ':'); i >= 0 {
			layer = layer[:i]
		}
	}
	t.faultSeed = seed
	t.faults[fault]++
	bump(t.layers, layer, 1)
}

func (t *Tally) onGap(e *Value) {
	lost := count(e.Get("lost"), "evidence.gap.lost")
	first := count(e.Get("first_failing_seq"), "evidence.gap.first_failing_seq")
	if t.firstGap == nil {
		t.firstGap = &first
	}
	t.gaps++
	t.lost = add(t.lost, lost)
}

// OpenCalls: the calls no closing event follows, in seq order (section 7.5).
func (t *Tally) OpenCalls() *Value {
	list := &Value{Kind: Array}
	for _, c := range t.calls {
		if c.open {
			list.Items = append(list.Items, newObject().Set("call_id", str(c.callID)).Set("seq", num(c.seq)))
		}
	}
	return list
}

// Cache: ops.cache as derived (section 7.8).
func (t *Tally) Cache() *Value {
	reasons := make([]string, 0, len(t.cacheRefused))
	for r := range t.cacheRefused {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	byReason := newObject()
	for _, r := range reasons {
		byReason.Set(r, num(t.cacheRefused[r]))
	}
	return newObject().Set("hits", num(t.cache[0])).Set("misses", num(t.cache[1])).
		Set("stored", num(t.cache[2])).Set("refused_by_reason", byReason).
		Set("saved_nusd", num(t.cache[3]))
}

// ClientRetries: ops.client_retries as derived (section 7.6).
func (t *Tally) ClientRetries() *Value {
	keys := make([]uint64, 0, len(t.attempts))
	for a := range t.attempts {
		keys = append(keys, a)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	var marked, retries uint64
	byAttempt := newObject()
	for _, a := range keys {
		marked = add(marked, t.attempts[a])
		if a > 0 {
			retries = add(retries, t.attempts[a])
		}
		byAttempt.Set(fmt.Sprint(a), num(t.attempts[a]))
	}
	return newObject().Set("marked", num(marked)).Set("retries", num(retries)).Set("by_attempt", byAttempt)
}

func usd(nusd uint64) string { return fmt.Sprintf("%d.%09d", nusd/1e9, nusd%1e9) }

func counterObject(c *[nCounters]uint64) *Value {
	o := newObject()
	for i, name := range counterNames {
		o.Set(name, num(c[i]))
	}
	return o.Set("usd", str(usd(c[cCost])))
}

func sortedNames(m interface{}) []string {
	var names []string
	switch m := m.(type) {
	case map[string]*[nCounters]uint64:
		for k := range m {
			names = append(names, k)
		}
	case map[string][3]string:
		for k := range m {
			names = append(names, k)
		}
	case map[string]uint64:
		for k := range m {
			names = append(names, k)
		}
	}
	sort.Strings(names) // byte order of UTF-8 is code point order
	return names
}

func countObject(m map[string]*uint64) *Value {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	o := newObject()
	for _, k := range names {
		o.Set(k, num(*m[k]))
	}
	return o
}

func countersObject(m map[string]*[nCounters]uint64) *Value {
	o := newObject()
	for _, k := range sortedNames(m) {
		o.Set(k, counterObject(m[k]))
	}
	return o
}

// transitions: breaker.state events per upstream, from-state and to-state (section 6.5).
func (t *Tally) transitions() *Value {
	o := newObject()
	for _, u := range sortedKeysOf(t.breaker) {
		froms := newObject()
		for _, f := range sortedKeysOf(t.breaker[u]) {
			froms.Set(f, countObject(t.breaker[u][f]))
		}
		o.Set(u, froms)
	}
	return o
}

func sortedKeysOf[V any](m map[string]V) []string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

func firstsList(m map[string]*firstCap) *Value {
	var all []*firstCap
	for _, f := range m {
		all = append(all, f)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].seq < all[j].seq })
	list := &Value{Kind: Array}
	for _, f := range all {
		list.Items = append(list.Items, newObject().Set("cap", str(f.cap)).Set("seq", num(f.seq)).
			Set("limit", f.limit).Set("observed", f.observed))
	}
	return list
}

// Claims: the receipt's derivable members (section 7.1), Unbacked where the
// event they come from is absent (section 7.2).
func (t *Tally) Claims() *Value {
	s, e := t.start, t.end
	if s == nil {
		seed := unbacked
		if len(t.faults) > 0 { // a fault's seed is still on the faults' own lines
			seed = t.faultSeed
		}
		s = &sessionStart{runID: unbacked, version: unbacked, digest: unbacked, ts: unbacked,
			tableDate: unbacked, provenance: unbacked, limits: unbacked, seed: seed, plan: unbacked}
	}
	var totals [nCounters]uint64
	byModel := newObject()
	for _, m := range sortedNames(t.models) {
		c := t.models[m]
		for i := range totals {
			totals[i] = add(totals[i], c[i])
		}
		byModel.Set(m, counterObject(c))
	}
	prices := newObject()
	for _, m := range sortedNames(t.prices) {
		p := t.prices[m]
		prices.Set(m, newObject().Set("input", str(p[0])).Set("output", str(p[1])).Set("cached_input", str(p[2])))
	}
	var injected uint64
	byFault := newObject()
	for _, f := range sortedNames(t.faults) {
		injected += t.faults[f]
		byFault.Set(f, num(t.faults[f]))
	}
	claims := newObject().
		Set("run_id", s.runID).
		Set("docket_version", s.version).
		Set("started_at", s.ts)
	if e == nil {
		claims.Set("ended_at", unbacked).Set("duration_ms", unbacked).Set("exit", unbacked)
	} else {
		claims.Set("ended_at", e.ts)
		if t.start == nil {
			claims.Set("duration_ms", unbacked)
		} else {
			claims.Set("duration_ms", numSigned(int64(e.mono)-int64(t.start.mono)))
		}
		claims.Set("exit", newObject().Set("status", e.status).Set("reason", e.reason).Set("cap", e.cap))
	}
	return claims.
		Set("totals", counterObject(&totals).Set("by_model", byModel).
			Set("refused_by_rule", countObject(t.refusals)).
			Set("by_provider", countersObject(t.providers)).
			Set("by_upstream", countersObject(t.upstreams)).
			Set("breaker_transitions", t.transitions())).
		Set("pricing", newObject().Set("table_date", s.tableDate).Set("provenance", s.provenance).
			Set("unit_prices", prices)).
		Set("caps", newObject().Set("limits", s.limits).Set("warnings", firstsList(t.warnings)).
			Set("breaches", firstsList(t.breaches))).
		Set("policy_digest", s.digest).
		Set("faults", newObject().Set("seed", s.seed).Set("plan", s.plan).
			Set("injected", num(injected)).Set("by_fault", byFault).
			Set("by_layer", countObject(t.layers)))
}

// checkForwarded: a model.request's record of bytes forwarded other than the
// agent's (section 5): forwarded_sha256 and forwarded_changes both absent or
// null, or both present, the digest 64 lowercase hex and not request_sha256,
// the changes a non-empty array of strings.
func checkForwarded(e *Value) {
	digest, changes := e.Get("forwarded_sha256"), e.Get("forwarded_changes")
	if digest.IsNull() && changes.IsNull() {
		return
	}
	if digest.IsNull() || changes.IsNull() {
		bad("model.request.forwarded_sha256 and forwarded_changes come together")
	}
	if digest.Kind != String || !isHex64(digest.Str) {
		bad("model.request.forwarded_sha256 must be 64 lowercase hex digits")
	}
	if req := e.Get("request_sha256"); req != nil && req.Kind == String && req.Str == digest.Str {
		bad("model.request.forwarded_sha256 must differ from request_sha256")
	}
	if changes.Kind != Array || len(changes.Items) == 0 {
		bad("model.request.forwarded_changes must be a non-empty array of strings")
	}
	for _, c := range changes.Items {
		if c.Kind != String {
			bad("model.request.forwarded_changes must be a non-empty array of strings")
		}
	}
}
