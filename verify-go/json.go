package main

// Strict JSON (spec section 2.1): one reading of a text, or a refusal.
//
// encoding/json is not used: it accepts duplicate names (last wins), has no
// depth bound of its own and turns numbers into float64, losing exact values.
// This reader keeps numbers as the text they were written as, refuses a name
// twice in one object, and uses an explicit stack, so a line of 64 MiB of
// brackets costs memory, never the goroutine's stack.

import (
	"fmt"
	"math/big"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is how deep objects and arrays may nest (rule 2.1.4).
const MaxDepth = 64

// MaxInt is 2^53-1: every integer the spec interprets lies in [0, MaxInt]
// unless it states a wider range.
const MaxInt = 1<<53 - 1

type Kind uint8

const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
	Unbacked // a derived claim the ledger cannot back (section 7.2); never read from text
	raw      // a skeleton's member, its text already checked; decoded when first read
)

// Value is one decoded JSON value. Numbers keep their text (Str) so that
// they compare by exact decimal value; Int says the text has no fraction
// and no exponent.
type Value struct {
	Kind    Kind
	B       bool
	Int     bool
	Str     string
	Items   []*Value // an array's elements
	Members []Member // an object's members, in text order
}

type Member struct {
	Key string
	Val *Value
}

// Get returns an object's member (nil when absent or when v is not an object).
func (v *Value) Get(name string) *Value {
	if v == nil || v.Kind != Object {
		return nil
	}
	for i := range v.Members {
		if v.Members[i].Key == name {
			m := v.Members[i].Val
			if m.Kind == raw {
				decoded, err := Decode([]byte(m.Str))
				if err != nil { // cannot be: the whole line was read before
					panic("a checked member does not decode: " + err.Msg)
				}
				*m = *decoded
			}
			return m
		}
	}
	return nil
}

func (v *Value) Has(name string) bool { return v.Get(name) != nil }

// Names: an object's member names, in text order.
func (v *Value) Names() []string {
	names := make([]string, len(v.Members))
	for i, m := range v.Members {
		names[i] = m.Key
	}
	return names
}

// IsNull is true for an absent member (nil) or a JSON null.
func (v *Value) IsNull() bool { return v == nil || v.Kind == Null }

// Count returns the value as an integer in [0, MaxInt].
func (v *Value) Count() (uint64, bool) {
	if v == nil || v.Kind != Number || !v.Int {
		return 0, false
	}
	s := v.Str
	if s == "-0" {
		return 0, true
	}
	if s[0] == '-' || len(s) > 16 {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		n = n*10 + uint64(s[i]-'0')
	}
	return n, n <= MaxInt
}

// SignedInt returns the value as an integer in [-MaxInt, MaxInt].
func (v *Value) SignedInt() (int64, bool) {
	if v == nil || v.Kind != Number || !v.Int {
		return 0, false
	}
	s, neg := v.Str, false
	if s[0] == '-' {
		s, neg = s[1:], true
	}
	if len(s) > 16 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		n = n*10 + int64(s[i]-'0')
	}
	if n > MaxInt {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

func num(n uint64) *Value { return &Value{Kind: Number, Int: true, Str: fmt.Sprint(n)} }
func numSigned(n int64) *Value {
	return &Value{Kind: Number, Int: true, Str: fmt.Sprint(n)}
}
func str(s string) *Value   { return &Value{Kind: String, Str: s} }
func boolean(b bool) *Value { return &Value{Kind: Bool, B: b} }

var null = &Value{Kind: Null}
var unbacked = &Value{Kind: Unbacked}

func newObject() *Value { return &Value{Kind: Object} }
func (v *Value) Set(k string, val *Value) *Value {
	v.Members = append(v.Members, Member{k, val})
	return v
}

// ParseError is a refusal. Ambiguous marks well-formed JSON that readers
// disagree on (a duplicate name, too deep): a receipt that is ambiguous is
// receipt_malformed, one that is not JSON is receipt_not_json.
type ParseError struct {
	Ambiguous bool
	Msg       string
}

func (e *ParseError) Error() string { return e.Msg }

type parser struct {
	data    []byte
	text    string // data as a string, copied once: strings and numbers are slices of it
	pos     int
	slab    []Value  // values are cut from here: one allocation for many
	members []Member // the open objects' members so far, innermost last
	items   []*Value // the open arrays' elements so far, innermost last
	stack   []frame
	// skeleton: check the whole text but build only the outer object, its
	// members kept as their text and decoded when read. A line of 64 MiB
	// holds millions of values no claim reads; built, they would cost GiBs.
	skeleton   bool
	valueStart int   // where the outer object's current member value begins
	throwaway  Value // what a skeleton's inner values are built into
}

// A Decoder reads many texts (a ledger's lines) and reuses its buffers.
type Decoder struct{ p parser }

// newValue hands out a Value from the slab. A value kept after its line
// (a session.start, a cap's limit) keeps its slab alive: a few KiB.
func (p *parser) newValue(k Kind) *Value {
	if p.skeleton && len(p.stack) > 0 {
		p.throwaway.Kind = k
		return &p.throwaway
	}
	if len(p.slab) == 0 {
		p.slab = make([]Value, 256)
	}
	v := &p.slab[0]
	p.slab = p.slab[1:]
	v.Kind = k
	return v
}

// names: member names seen before, so a ledger's few dozen names are
// allocated once, not once per line. Bounded: a file of ever new names
// stops being interned once it holds maxInterned.
var names = map[string]string{}

const maxInterned = 4096

func intern(b []byte) string {
	if s, ok := names[string(b)]; ok { // the lookup does not allocate
		return s
	}
	s := string(b)
	if len(names) < maxInterned && len(s) <= 64 {
		names[s] = s
	}
	return s
}

func (p *parser) fail(format string, args ...interface{}) *ParseError {
	return &ParseError{Msg: fmt.Sprintf(format, args...) + fmt.Sprintf(" at byte %d", p.pos)}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (p *parser) skipSpace() {
	for p.pos < len(p.data) && isSpace(p.data[p.pos]) {
		p.pos++
	}
}

type frame struct {
	v     *Value
	kind  Kind                // Array or Object (a skeleton's inner frames share one v)
	start int                 // where its members (or items) begin in p.members (p.items)
	index map[string]struct{} // names seen, for objects with many members
}

// close gives the innermost container its members (or items), exactly sized.
func (p *parser) close() *Value {
	top := p.stack[len(p.stack)-1]
	p.stack = p.stack[:len(p.stack)-1]
	v := top.v
	if p.skeleton && len(p.stack) > 0 { // an inner value: checked, not kept
		if top.kind == Object {
			p.members = p.members[:top.start]
		} else {
			p.items = p.items[:top.start]
		}
		return v
	}
	if top.kind == Object {
		v.Members = append([]Member(nil), p.members[top.start:]...)
		p.members = p.members[:top.start]
	} else {
		v.Items = append([]*Value(nil), p.items[top.start:]...)
		p.items = p.items[:top.start]
	}
	return v
}

// Decode reads exactly one strict JSON value from data.
func Decode(data []byte) (*Value, *ParseError) {
	var d Decoder
	return d.Decode(data)
}

// Decode reads exactly one strict JSON value from data.
//
// Refusals come in text order: the first thing wrong, reading from the
// start, is the reason. A duplicate name is wrong where its member's value
// begins; nesting too deep, where the bracket that opens level 65 stands.
// That is enough for a ledger line (any refusal is malformed_line); a
// receipt is read with DecodeReceipt, which judges "is it JSON" first.
func (d *Decoder) Decode(data []byte) (*Value, *ParseError) {
	p := &d.p
	p.data, p.pos = data, 0
	p.text = string(data)
	p.stack, p.members, p.items = p.stack[:0], p.members[:0], p.items[:0]
	defer func() { p.data, p.text = nil, "" }()
	var root *Value
	p.skipSpace()
	for {
		// Read a value at p.pos.
		if p.pos >= len(data) {
			return nil, p.fail("unexpected end of text")
		}
		var v *Value
		c := data[p.pos]
		switch {
		case c == '{' || c == '[':
			p.pos++
			k, closer, start := Array, byte(']'), len(p.items)
			if c == '{' {
				k, closer, start = Object, '}', len(p.members)
			}
			if len(p.stack)+1 > MaxDepth {
				// Refused here, in text order like any other fault: reading on
				// would cost memory for a text that can only be refused.
				return nil, &ParseError{Ambiguous: true,
					Msg: fmt.Sprintf("nested more than %d levels deep at byte %d", MaxDepth, p.pos-1)}
			}
			v = p.newValue(k)
			p.stack = append(p.stack, frame{v: v, kind: k, start: start})
			p.skipSpace()
			if p.pos < len(data) && data[p.pos] == closer {
				p.pos++
				v = p.close()
				// v is complete: attach it below
			} else {
				if k == Object {
					if err := p.memberName(&p.stack[len(p.stack)-1]); err != nil {
						return nil, err
					}
				}
				continue
			}
		case c == '"':
			s, err := p.str(false)
			if err != nil {
				return nil, err
			}
			v = p.newValue(String)
			v.Str = s
		case c == '-' || (c >= '0' && c <= '9'):
			text, isInt, err := p.number()
			if err != nil {
				return nil, err
			}
			if problem := numberProblem(text); problem != "" {
				return nil, &ParseError{Ambiguous: true, Msg: fmt.Sprintf("%s at byte %d", problem, p.pos)}
			}
			v = p.newValue(Number)
			v.Str, v.Int = text, isInt
		case c == 't':
			if err := p.literal("true"); err != nil {
				return nil, err
			}
			v = p.newValue(Bool)
			v.B = true
		case c == 'f':
			if err := p.literal("false"); err != nil {
				return nil, err
			}
			v = p.newValue(Bool)
		case c == 'n':
			if err := p.literal("null"); err != nil {
				return nil, err
			}
			v = null
		default:
			return nil, p.fail("unexpected %q", rune(c))
		}
		// Attach v to its container; close containers that end here.
		for {
			if len(p.stack) == 0 {
				root = v
				break
			}
			top := &p.stack[len(p.stack)-1]
			switch {
			case p.skeleton && len(p.stack) == 1 && top.kind == Object:
				p.members[len(p.members)-1].Val = &Value{Kind: raw, Str: p.text[p.valueStart:p.pos]}
			case p.skeleton && len(p.stack) > 1:
				// an inner value: its container keeps names only (for duplicates)
			case top.kind == Array:
				p.items = append(p.items, v)
			default:
				p.members[len(p.members)-1].Val = v
			}
			p.skipSpace()
			if p.pos >= len(data) {
				return nil, p.fail("unexpected end of text")
			}
			c := data[p.pos]
			if c == ',' {
				p.pos++
				p.skipSpace()
				if top.kind == Object {
					if err := p.memberName(top); err != nil {
						return nil, err
					}
				}
				break
			}
			if (top.kind == Array && c == ']') || (top.kind == Object && c == '}') {
				p.pos++
				v = p.close()
				continue
			}
			return nil, p.fail("expected , or a closing bracket")
		}
		if root != nil {
			break
		}
	}
	p.skipSpace()
	if p.pos != len(data) {
		return nil, p.fail("text after the value")
	}
	return root, nil
}

// memberName reads `"name" :` and refuses a name the object already has.
func (p *parser) memberName(top *frame) *ParseError {
	if p.pos >= len(p.data) || p.data[p.pos] != '"' {
		return p.fail("expected a member name")
	}
	name, err := p.str(true)
	if err != nil {
		return err
	}
	p.skipSpace()
	if p.pos >= len(p.data) || p.data[p.pos] != ':' {
		return p.fail("expected :")
	}
	p.pos++
	p.skipSpace()
	open := p.members[top.start:]
	dup := false
	if top.index != nil {
		_, dup = top.index[name]
	} else {
		for i := range open {
			if open[i].Key == name {
				dup = true
				break
			}
		}
	}
	if dup {
		return &ParseError{Ambiguous: true, Msg: fmt.Sprintf("duplicate name %q at byte %d", name, p.pos)}
	}
	p.members = append(p.members, Member{Key: name})
	if len(p.stack) == 1 {
		p.valueStart = p.pos
	}
	if top.index != nil {
		top.index[name] = struct{}{}
	} else if len(open) >= 16 { // a linear search is quicker below this
		top.index = make(map[string]struct{}, 32)
		for _, m := range p.members[top.start:] {
			top.index[m.Key] = struct{}{}
		}
	}
	return nil
}

func (p *parser) literal(word string) *ParseError {
	if !strings.HasPrefix(string(p.data[p.pos:min(len(p.data), p.pos+len(word))]), word) {
		return p.fail("not a JSON literal (NaN, Infinity and the like are not JSON)")
	}
	p.pos += len(word)
	return nil
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func digits(data []byte, pos int) int {
	for pos < len(data) && data[pos] >= '0' && data[pos] <= '9' {
		pos++
	}
	return pos
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? and returns its text.
func (p *parser) number() (string, bool, *ParseError) {
	d, start := p.data, p.pos
	i := start
	if d[i] == '-' {
		i++
	}
	if i >= len(d) {
		return "", false, p.fail("a number with no digits")
	}
	if d[i] == '0' {
		i++
	} else if d[i] >= '1' && d[i] <= '9' {
		i = digits(d, i)
	} else {
		p.pos = i
		return "", false, p.fail("a number with no digits (Infinity is not JSON)")
	}
	isInt := true
	if i < len(d) && d[i] == '.' {
		j := digits(d, i+1)
		if j == i+1 {
			p.pos = j
			return "", false, p.fail("no digits after the decimal point")
		}
		i, isInt = j, false
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		i++
		if i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		j := digits(d, i)
		if j == i {
			p.pos = j
			return "", false, p.fail("no digits in the exponent")
		}
		i, isInt = j, false
	}
	p.pos = i
	return p.text[start:i], isInt, nil
}

// Rule 2.1.7: a number's size, judged on its text before anything converts
// it. At most 32 significand digits, at most 4 exponent digits, and unless it
// is zero, the power of ten of its first non-zero digit in [-300, 300].
const (
	MaxSignificandDigits = 32
	MaxExponentDigits    = 4
	MaxAdjustedExponent  = 300
)

// numberProblem says why a number token (already checked for syntax) breaks
// rule 2.1.7, or "".
func numberProblem(text string) string {
	s := strings.TrimPrefix(text, "-")
	exp := ""
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		s, exp = s[:i], s[i+1:]
	}
	whole, frac := s, ""
	if i := strings.IndexByte(s, '.'); i >= 0 {
		whole, frac = s[:i], s[i+1:]
	}
	if n := len(whole) + len(frac); n > MaxSignificandDigits {
		return fmt.Sprintf("a number with %d digits before its exponent (at most %d)", n, MaxSignificandDigits)
	}
	negExp := strings.HasPrefix(exp, "-")
	exp = strings.TrimLeft(exp, "+-")
	if len(exp) > MaxExponentDigits {
		return fmt.Sprintf("a number whose exponent has %d digits (at most %d)", len(exp), MaxExponentDigits)
	}
	fracZeros := len(frac) - len(strings.TrimLeft(frac, "0"))
	if whole == "0" && fracZeros == len(frac) {
		return "" // zero, whatever its exponent
	}
	power := 0
	for i := 0; i < len(exp); i++ {
		power = power*10 + int(exp[i]-'0')
	}
	if negExp {
		power = -power
	}
	adjusted := power - 1 - fracZeros
	if whole != "0" {
		adjusted = power + len(whole) - 1
	}
	if adjusted < -MaxAdjustedExponent || adjusted > MaxAdjustedExponent {
		return fmt.Sprintf("a number of magnitude 10^%d (at most 10^%d, at least 10^-%d)",
			adjusted, MaxAdjustedExponent, MaxAdjustedExponent)
	}
	return ""
}

func hex4(b []byte) (rune, bool) {
	var r rune
	for _, c := range b {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// str reads a string at p.pos (its opening quote) and returns it unescaped.
func (p *parser) str(isName bool) (string, *ParseError) {
	d := p.data
	i := p.pos + 1
	start := i
	// Fast path: plain ASCII with no escapes.
	for i < len(d) {
		c := d[i]
		if c == '"' {
			p.pos = i + 1
			if isName {
				return intern(d[start:i]), nil
			}
			return p.text[start:i], nil
		}
		if c == '\\' || c < 0x20 || c >= 0x80 {
			break
		}
		i++
	}
	var b strings.Builder
	b.Write(d[start:i])
	for {
		if i >= len(d) {
			p.pos = i
			return "", p.fail("a string with no closing quote")
		}
		c := d[i]
		switch {
		case c == '"':
			p.pos = i + 1
			return b.String(), nil
		case c < 0x20:
			p.pos = i
			return "", p.fail("a control character in a string")
		case c < 0x80:
			if c != '\\' {
				b.WriteByte(c)
				i++
				continue
			}
			if i+1 >= len(d) {
				p.pos = i
				return "", p.fail("a string with no closing quote")
			}
			e := d[i+1]
			i += 2
			switch e {
			case '"', '\\', '/':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				r, ok := p.u4(i)
				if !ok {
					p.pos = i
					return "", p.fail("a bad \\u escape")
				}
				i += 4
				if r >= 0xDC00 && r <= 0xDFFF {
					p.pos = i
					return "", p.fail("a \\u escape leaves a lone surrogate")
				}
				if r >= 0xD800 && r <= 0xDBFF {
					var lo rune
					ok := i+1 < len(d) && d[i] == '\\' && d[i+1] == 'u'
					if ok {
						lo, ok = p.u4(i + 2)
					}
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						p.pos = i
						return "", p.fail("a \\u escape leaves a lone surrogate")
					}
					i += 6
					r = utf16.DecodeRune(r, lo)
				}
				b.WriteRune(r)
			default:
				p.pos = i - 1
				return "", p.fail("a bad escape")
			}
		default:
			r, size := utf8.DecodeRune(d[i:])
			if r == utf8.RuneError && size <= 1 {
				p.pos = i
				return "", p.fail("invalid UTF-8")
			}
			b.Write(d[i : i+size])
			i += size
		}
	}
}

func (p *parser) u4(i int) (rune, bool) {
	if i+4 > len(p.data) {
		return 0, false
	}
	return hex4(p.data[i : i+4])
}

// ---------------------------------------------------------------- equality

// decimal is a number's exact value: sign, significant digits with no
// leading or trailing zeros, and the power of ten of the last digit.
type decimal struct {
	neg    bool
	digits string
	exp    *big.Int
}

func toDecimal(text string) decimal {
	s := text
	neg := false
	if s[0] == '-' {
		neg, s = true, s[1:]
	}
	exp := new(big.Int)
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		exp.SetString(strings.TrimPrefix(s[i+1:], "+"), 10)
		s = s[:i]
	}
	if i := strings.IndexByte(s, '.'); i >= 0 {
		exp.Sub(exp, big.NewInt(int64(len(s)-i-1)))
		s = s[:i] + s[i+1:]
	}
	s = strings.TrimLeft(s, "0")
	trimmed := strings.TrimRight(s, "0")
	exp.Add(exp, big.NewInt(int64(len(s)-len(trimmed))))
	if trimmed == "" { // zero: -0 and 0e5 are 0
		return decimal{digits: "", exp: new(big.Int)}
	}
	return decimal{neg: neg, digits: trimmed, exp: exp}
}

func sameNumber(a, b string) bool {
	if a == b {
		return true
	}
	x, y := toDecimal(a), toDecimal(b)
	return x.neg == y.neg && x.digits == y.digits && x.exp.Cmp(y.exp) == 0
}

// Equal is section 7.3's equality.
func Equal(a, b *Value) bool {
	if a.Kind != b.Kind {
		return false
	}
	switch a.Kind {
	case Null:
		return true
	case Bool:
		return a.B == b.B
	case String:
		return a.Str == b.Str
	case Number:
		return sameNumber(a.Str, b.Str)
	case Array:
		if len(a.Items) != len(b.Items) {
			return false
		}
		for i := range a.Items {
			if !Equal(a.Items[i], b.Items[i]) {
				return false
			}
		}
		return true
	case Object:
		if len(a.Members) != len(b.Members) {
			return false
		}
		for _, m := range a.Members {
			w := b.Get(m.Key)
			if w == nil || !Equal(m.Val, w) {
				return false
			}
		}
		return true
	}
	return false
}

// Show renders a value for a message (free text), shortened.
func Show(v *Value) string {
	var b strings.Builder
	show(&b, v)
	s := b.String()
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}

func show(b *strings.Builder, v *Value) {
	if v == nil {
		b.WriteString("none")
		return
	}
	switch v.Kind {
	case Null:
		b.WriteString("null")
	case Bool:
		fmt.Fprint(b, v.B)
	case Number:
		b.WriteString(v.Str)
	case String:
		b.WriteString(quote(v.Str))
	case Array:
		b.WriteByte('[')
		for i, it := range v.Items {
			if i > 0 {
				b.WriteString(", ")
			}
			show(b, it)
		}
		b.WriteByte(']')
	case Object:
		b.WriteByte('{')
		for i, k := range sortedKeys(v) {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(quote(k) + ": ")
			show(b, v.Get(k))
		}
		b.WriteByte('}')
	case Unbacked:
		b.WriteString("UNBACKED")
	}
}

// quote writes s in JSON string syntax: `"` and `\` and control characters
// escaped, everything else (non-ASCII included) as itself.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}
