package main

// The receipt's `fleet` (spec section 7.10): a [fleet] run's budget as session.start
// names it (the budget and where its database is), the fleet.lease changes and the
// amounts they moved, the fleet rule's refusals by code, the failed exchanges with the
// database (fleet.store) and how the run's last lease ended. Absent from the receipt:
// the run held no fleet budget. Without a session.start it is unbacked when stated,
// and nothing when not.

var fleetDims = []string{"nusd", "tokens", "calls"}

// fleetTotals: each receipt total and the fleet.lease member prefix that adds to it.
var fleetTotals = [][2]string{{"granted", "granted"}, {"reported", "reported"}, {"returned", "unused"}, {"lapsed", "held"}}

// fleetEndedBy: what each change says became of the run's own lease (`expired` names
// a lease the budget folded at this run's exchange, which may be another run's).
var fleetEndedBy = map[string]string{"drawn": "held", "renewed": "held", "returned": "returned", "lost": "lost"}

type fleetFold struct {
	changes       map[string]*uint64
	amounts       [4][3]uint64 // fleetTotals x fleetDims
	refused       map[string]*uint64
	storeFailures uint64
	ended         string
}

func init() {
	amounts := obj(map[string]*shape{"nusd": isCount, "tokens": isCount, "calls": isCount})
	receiptShape.fields["fleet"] = opt(obj(map[string]*shape{
		"budget":          isStr,
		"database":        obj(map[string]*shape{"host": isStrOrNull, "port": isStrOrNull, "dbname": isStrOrNull}),
		"leases":          &shape{mapOf: isCount},
		"granted":         amounts,
		"reported":        amounts,
		"returned":        amounts,
		"lapsed":          amounts,
		"refused_by_code": &shape{mapOf: isCount},
		"store_failures":  isCount,
		"ended":           isStr,
	}))
}

func (f *fleetFold) ready() {
	if f.changes == nil {
		f.changes, f.refused, f.ended = map[string]*uint64{}, map[string]*uint64{}, "none"
	}
}

// fleetOrNull: session.start's fleet, checked (section 7.10), or null.
func fleetOrNull(v *Value, where string) *Value {
	if v.IsNull() {
		return &Value{Kind: Null}
	}
	object(v, where)
	if len(v.Members) != 2 || v.Get("budget") == nil || v.Get("database") == nil {
		bad("%s must be an object of exactly budget and database", where)
	}
	text(v.Get("budget"), where+".budget")
	db := object(v.Get("database"), where+".database")
	if len(db.Members) != 3 || db.Get("host") == nil || db.Get("port") == nil || db.Get("dbname") == nil {
		bad("%s.database must be an object of exactly host, port, dbname", where)
	}
	for _, n := range []string{"host", "port", "dbname"} {
		textOrNull(db.Get(n), where+".database."+n)
	}
	return v
}

func (f *fleetFold) onLease(e *Value) {
	f.ready()
	change := text(e.Get("change"), "fleet.lease.change").Str
	var adds [4][3]uint64 // checked whole before anything is added
	for i, tp := range fleetTotals {
		for j, d := range fleetDims {
			name := tp[1] + "_" + d
			if v := e.Get(name); !v.IsNull() {
				adds[i][j] = count(v, "fleet.lease."+name)
			}
		}
	}
	for i := range adds {
		for j := range adds[i] {
			f.amounts[i][j] = add(f.amounts[i][j], adds[i][j])
		}
	}
	bump(f.changes, change, 1)
	if ended, ok := fleetEndedBy[change]; ok {
		f.ended = ended
	}
}

func (f *fleetFold) onStore() {
	f.ready()
	f.storeFailures = add(f.storeFailures, 1)
}

func (f *fleetFold) onRefused(code string) {
	f.ready()
	bump(f.refused, code, 1)
}

// Fleet: the receipt's fleet as derived, null when session.start names no fleet.
func (t *Tally) Fleet() *Value {
	start := t.start.fleet
	if start.IsNull() {
		return &Value{Kind: Null}
	}
	f := &t.fleet
	f.ready()
	out := newObject().Set("budget", start.Get("budget")).Set("database", start.Get("database")).
		Set("leases", countObject(f.changes))
	for i, tp := range fleetTotals {
		amounts := newObject()
		for j, d := range fleetDims {
			amounts.Set(d, num(f.amounts[i][j]))
		}
		out.Set(tp[0], amounts)
	}
	return out.Set("refused_by_code", countObject(f.refused)).
		Set("store_failures", num(f.storeFailures)).Set("ended", str(f.ended))
}

// fleetProblem: the first difference between the receipt's fleet and the ledger's.
func fleetProblem(receipt *Value, t *Tally, unbacked *[]string) (string, string, bool) {
	stated := receipt.Get("fleet")
	if t.start == nil {
		if stated != nil {
			*unbacked = append(*unbacked, "fleet")
		}
		return "", "", false
	}
	if stated == nil {
		stated = &Value{Kind: Null}
	}
	return firstDifference(stated, t.Fleet(), "fleet", unbacked)
}
