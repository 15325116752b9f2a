package httplimit_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A strict parser of RFC 9651 structured-field Lists, enough to check
// every RateLimit-Policy and RateLimit value the middleware sends. It
// follows the parsing algorithms of RFC 9651 section 4.2 and fails on
// anything they reject.

// sfItem is a List member: a bare item (or, for an inner list, its items)
// with its parameters in order.
type sfItem struct {
	bare   any // int64, sfDecimal, string, sfToken, []byte, bool, sfDate, or []sfItem for an inner list
	params []sfParam
}

type sfParam struct {
	key   string
	value any
}

type (
	sfToken   string
	sfDecimal string
	sfDate    int64
)

// param returns the value of parameter key, and whether it is present.
func (it sfItem) param(key string) (any, bool) {
	for _, p := range it.params {
		if p.key == key {
			return p.value, true
		}
	}
	return nil, false
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) fail(format string, args ...any) error {
	return fmt.Errorf("sf: at %d of %q: %s", p.i, p.s, fmt.Sprintf(format, args...))
}

func (p *sfParser) peek() (byte, bool) {
	if p.i < len(p.s) {
		return p.s[p.i], true
	}
	return 0, false
}

// parseSFList parses a whole field value as a List.
func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	p.skipSP()
	var list []sfItem
	for p.i < len(p.s) {
		it, err := p.member()
		if err != nil {
			return nil, err
		}
		list = append(list, it)
		p.skipOWS()
		if p.i == len(p.s) {
			return list, nil
		}
		if p.s[p.i] != ',' {
			return nil, p.fail("expected ','")
		}
		p.i++
		p.skipOWS()
		if p.i == len(p.s) {
			return nil, p.fail("trailing comma")
		}
	}
	return list, nil // an empty field is an empty list
}

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) member() (sfItem, error) {
	if c, _ := p.peek(); c == '(' {
		return p.innerList()
	}
	return p.item()
}

func (p *sfParser) innerList() (sfItem, error) {
	p.i++ // '('
	var items []sfItem
	for p.i < len(p.s) {
		p.skipSP()
		if p.s[p.i] == ')' {
			p.i++
			params, err := p.parameters()
			return sfItem{bare: items, params: params}, err
		}
		it, err := p.item()
		if err != nil {
			return sfItem{}, err
		}
		items = append(items, it)
		if c, ok := p.peek(); !ok || (c != ' ' && c != ')') {
			return sfItem{}, p.fail("inner list member not followed by SP or ')'")
		}
	}
	return sfItem{}, p.fail("unterminated inner list")
}

func (p *sfParser) item() (sfItem, error) {
	bare, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	params, err := p.parameters()
	return sfItem{bare: bare, params: params}, err
}

func (p *sfParser) parameters() ([]sfParam, error) {
	var params []sfParam
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		var value any = true
		if c, _ := p.peek(); c == '=' {
			p.i++
			if value, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		replaced := false
		for j := range params {
			if params[j].key == key {
				params[j].value, replaced = value, true
			}
		}
		if !replaced {
			params = append(params, sfParam{key, value})
		}
	}
	return params, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	c, ok := p.peek()
	if !ok || !(c >= 'a' && c <= 'z' || c == '*') {
		return "", p.fail("bad key")
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("_-.*", c) >= 0) {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem() (any, error) {
	c, ok := p.peek()
	switch {
	case !ok:
		return nil, p.fail("missing item")
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
		return p.token(), nil
	case c == ':':
		return p.binary()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, p.fail("bad boolean")
	case c == '@':
		p.i++
		n, err := p.number()
		if i, ok := n.(int64); err == nil && ok {
			return sfDate(i), nil
		}
		return nil, p.fail("bad date")
	}
	return nil, p.fail("unknown item type %q", c)
}

func (p *sfParser) number() (any, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digitsStart, dot := p.i, -1
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == '.' && dot < 0 {
			dot = p.i
		} else if c < '0' || c > '9' {
			break
		}
		p.i++
	}
	num := p.s[digitsStart:p.i]
	switch {
	case num == "" || num[0] == '.':
		return nil, p.fail("bad number")
	case dot < 0:
		if len(num) > 15 {
			return nil, p.fail("integer of more than 15 digits")
		}
		n, err := strconv.ParseInt(p.s[start:p.i], 10, 64)
		return n, err
	}
	intPart, frac := p.s[digitsStart:dot], p.s[dot+1:p.i]
	if len(intPart) > 12 || len(frac) < 1 || len(frac) > 3 {
		return nil, p.fail("bad decimal")
	}
	return sfDecimal(p.s[start:p.i]), nil
}

func (p *sfParser) str() (string, error) {
	p.i++ // '"'
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i == len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", p.fail("bad escape")
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", p.fail("byte %#x in a string", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", p.fail("unterminated string")
}

func (p *sfParser) token() sfToken {
	start := p.i
	p.i++
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0) {
			break
		}
		p.i++
	}
	return sfToken(p.s[start:p.i])
}

func (p *sfParser) binary() ([]byte, error) {
	p.i++ // ':'
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return nil, p.fail("unterminated byte sequence")
	}
	enc := p.s[p.i : p.i+end]
	p.i += end + 1
	b, err := base64.StdEncoding.Strict().DecodeString(enc)
	if err != nil {
		return nil, errors.Join(p.fail("bad base64"), err)
	}
	return b, nil
}
