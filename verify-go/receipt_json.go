package main

// A receipt's step 2 (spec section 8): whether the text is JSON is decided
// over the whole text before a duplicate name or nesting past 64 levels is
// held against it. Decode stops at the first fault in text order, so a text
// it refuses as ambiguous is read again, for syntax only, to the end: a
// syntax error or a lone surrogate anywhere makes it not JSON.

// DecodeReceipt reads a receipt's text. A refusal with Ambiguous set means
// the text is JSON but breaks rule 2.1.3 or 2.1.4 (receipt_malformed); any
// other refusal means it is not JSON (receipt_not_json).
func DecodeReceipt(data []byte) (*Value, *ParseError) {
	v, err := Decode(data)
	if err != nil && err.Ambiguous {
		if syntax := jsonSyntax(data); syntax != nil {
			return nil, syntax
		}
	}
	return v, err
}

// jsonSyntax checks that data is one JSON text under rules 2.1.1, 2.1.2,
// 2.1.5 and 2.1.6, with no depth bound and no duplicate check, building
// nothing. Its stack is one byte per open container, never the goroutine's
// stack: a 16 MiB receipt of brackets costs 16 MiB.
func jsonSyntax(data []byte) *ParseError {
	p := &parser{data: data, text: string(data)}
	var open []byte // the closer each open container awaits, innermost last
	p.skipSpace()
	for {
		// A value at p.pos.
		if p.pos >= len(data) {
			return p.fail("unexpected end of text")
		}
		c := data[p.pos]
		switch {
		case c == '{' || c == '[':
			p.pos++
			closer := byte(']')
			if c == '{' {
				closer = '}'
			}
			p.skipSpace()
			if p.pos < len(data) && data[p.pos] == closer {
				p.pos++ // empty: a complete value
				break
			}
			open = append(open, closer)
			if closer == '}' {
				if err := p.nameAndColon(); err != nil {
					return err
				}
			}
			continue
		case c == '"':
			if _, err := p.str(false); err != nil {
				return err
			}
		case c == '-' || (c >= '0' && c <= '9'):
			if _, _, err := p.number(); err != nil {
				return err
			}
		case c == 't':
			if err := p.literal("true"); err != nil {
				return err
			}
		case c == 'f':
			if err := p.literal("false"); err != nil {
				return err
			}
		case c == 'n':
			if err := p.literal("null"); err != nil {
				return err
			}
		default:
			return p.fail("unexpected %q", rune(c))
		}
		// A value is complete: a comma, or closers, or the end of the text.
	afterValue:
		for {
			p.skipSpace()
			if len(open) == 0 {
				if p.pos != len(data) {
					return p.fail("text after the value")
				}
				return nil
			}
			if p.pos >= len(data) {
				return p.fail("unexpected end of text")
			}
			closer := open[len(open)-1]
			switch data[p.pos] {
			case ',':
				p.pos++
				p.skipSpace()
				if closer == '}' {
					if err := p.nameAndColon(); err != nil {
						return err
					}
				}
				break afterValue
			case closer:
				p.pos++
				open = open[:len(open)-1]
			default:
				return p.fail("expected , or a closing bracket")
			}
		}
	}
}

// nameAndColon reads `"name" :` for the syntax check (no duplicate check).
func (p *parser) nameAndColon() *ParseError {
	if p.pos >= len(p.data) || p.data[p.pos] != '"' {
		return p.fail("expected a member name")
	}
	if _, err := p.str(false); err != nil {
		return err
	}
	p.skipSpace()
	if p.pos >= len(p.data) || p.data[p.pos] != ':' {
		return p.fail("expected :")
	}
	p.pos++
	p.skipSpace()
	return nil
}
