package httplimit

import (
	"errors"
	"fmt"
	"hash/maphash"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"unsafe"
)

// ErrNoClientAddr is returned by [ClientIP.Addr] and [ClientIP.Key] when a
// request's RemoteAddr is not an IP address (a Unix socket's peer, or a
// request built by hand without one). A server behind a proxy that connects
// over a Unix socket has no peer address to trust; key its requests with a
// [KeyFunc] that reads the header the proxy sets.
var ErrNoClientAddr = errors.New("httplimit: no client address")

// ClientIP finds the address of the client that sent a request, and keys
// requests by it.
//
// Nothing is trusted by default: with no TrustedProxies the client is the
// request's immediate peer, RemoteAddr, and every forwarded header is
// ignored, since any client can send one. When the immediate peer is inside
// TrustedProxies, the forwarded header named by Header is read from right to
// left, the direction in which proxies append: each hop that is itself a
// trusted proxy is passed over, and the client is the first (rightmost) hop
// that is not. A hop that is not an address (RFC 7239's "unknown", an
// obfuscated identifier, an element without for=, garbage) ends the walk,
// and the client is then the last trusted hop passed (or the peer), since
// nothing to its left was vouched for by a trusted proxy; the same holds
// when every hop is trusted, or after 32 trusted hops. Malformed headers
// are never an error and never let a client choose its own address:
// whatever a client writes lies to the left of what the trusted proxies
// append. (In RFC 7239 syntax, a quoted string the client leaves open runs
// to the end of its header line and can hide what a proxy appended to that
// same line; the walk then ends at the proxy, never at an address of the
// client's choosing.)
//
// IPv4-mapped IPv6 addresses are treated as the IPv4 addresses they carry,
// and IPv6 zones are dropped.
//
// A ClientIP is a plain value, safe for concurrent use as long as its
// TrustedProxies slice is not modified after it is put to use.
type ClientIP struct {
	// TrustedProxies are the networks of the reverse proxies in front of the
	// server. A forwarded header is read only when the immediate peer is
	// inside one of them. Nil, the default, trusts nothing.
	TrustedProxies []netip.Prefix

	// Header is the one forwarded header the trusted proxies maintain; only
	// it is read, because a header the proxies do not append to or overwrite
	// is written entirely by the client. "" means X-Forwarded-For.
	// "Forwarded" is parsed as RFC 7239 (its for= parameters); any other
	// name (X-Forwarded-For, X-Real-IP, ...) as a comma-separated list of
	// addresses, each optionally with a port. Several lines of the header
	// are read as one list, in order.
	Header string

	// IPv6Prefix is how many leading bits of an IPv6 client address make its
	// key. One subscriber is usually given a whole /64, so keying by the full
	// address would hand every subscriber 2^64 allowances. 0 means 64; other
	// values are clamped to 1..128. Providers that give a subscriber a /56
	// or a /48 let one client change its /64 at will: 56 (the grouping
	// express-rate-limit uses) or 48 closes that, at the price of keying
	// together the subscribers of a provider that hands out /64s from one
	// /56. IPv4 addresses, IPv4-mapped ones included, are always keyed
	// whole.
	IPv6Prefix int
}

// maxHops bounds the forwarded hops examined per request, so that a huge
// header costs no more than a short one. A chain longer than this through
// trusted proxies ends at the last trusted hop examined.
const maxHops = 32

// Addr returns the client address of r, as described on [ClientIP]. The
// only error is [ErrNoClientAddr], for a RemoteAddr that is not an address.
func (c ClientIP) Addr(r *http.Request) (netip.Addr, error) {
	peer, ok := parsePeer(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("%w: RemoteAddr %q", ErrNoClientAddr, r.RemoteAddr)
	}
	if !c.trusted(peer) {
		return peer, nil
	}
	name := c.Header
	if name == "" {
		name = "X-Forwarded-For"
	}
	forwarded := strings.EqualFold(name, "Forwarded")
	client, seen := peer, 0
	lines := r.Header.Values(name)
	for i := len(lines) - 1; i >= 0; i-- {
		var buf [maxHops]hop
		hops := parseHops(lines[i], forwarded, buf[:0])
		for j := len(hops) - 1; j >= 0; j-- {
			h := hops[j]
			if !h.ok || seen == maxHops {
				return client, nil
			}
			seen++
			client = h.addr
			if !c.trusted(client) {
				return client, nil
			}
		}
	}
	return client, nil
}

// Key returns the client address of r as a key for a [ratelimit.Store]:
// "ip:" and the address for IPv4, "ip:" and the masked prefix (such as
// "ip:2001:db8:1:2::/64") for IPv6. It has the type of a [KeyFunc] and is
// the middleware's default key.
func (c ClientIP) Key(r *http.Request) (string, error) {
	a, err := c.Addr(r)
	if err != nil {
		return "", err
	}
	return AddrKey(a, c.IPv6Prefix), nil
}

// AddrKey returns the key [ClientIP.Key] makes for the address a: "ip:"
// and a for IPv4, "ip:" and a's prefix of ipv6Prefix bits for IPv6 (0
// meaning 64; other values clamped to 1..128). Code that limits the same
// clients elsewhere (by a gRPC peer's address, say) uses it to reach the
// same allowances. The string may be one it returned before for the same
// key (see [Middleware] on the cost of keys).
func AddrKey(a netip.Addr, ipv6Prefix int) string {
	var buf [64]byte
	b := append(buf[:0], "ip:"...)
	if a.Is4() {
		b = a.AppendTo(b)
	} else {
		p, _ := a.Prefix(ipv6Bits(ipv6Prefix)) // bits in 1..128: cannot fail
		b = p.AppendTo(b)
	}
	return keys.intern(b)
}

// keys holds the keys most recently made by [AddrKey] and [SecretKey], so
// that a client's next request finds its key made and allocates nothing
// for it.
var keys = newInternTable(1024)

// internTable is a bounded, direct-mapped table of short strings: each
// slot holds the last string interned there, and a string that lands in
// an occupied slot replaces what it holds. It never holds more than its
// slots, however many distinct strings pass, and lookups take no lock.
// Strings are immutable, so handing out the same one twice is invisible to
// callers.
//
// A slot points at one allocation: a length byte, then the string's bytes
// (at most maxInterned of them). A string handed out is those bytes, so it
// takes no more memory than string(b) would, whoever keeps it.
type internTable struct {
	seed  maphash.Seed
	slots []atomic.Pointer[byte]
}

// maxInterned is the longest string an internTable holds.
const maxInterned = 64

// newInternTable returns an internTable of n slots, a power of two.
func newInternTable(n int) *internTable {
	return &internTable{seed: maphash.MakeSeed(), slots: make([]atomic.Pointer[byte], n)}
}

// intern returns string(b), the same string as the last call with the same
// bytes if its slot still holds it. It allocates once when it does not, or
// when b is too long to hold.
func (t *internTable) intern(b []byte) string {
	if len(b) == 0 || len(b) > maxInterned {
		return string(b)
	}
	slot := &t.slots[maphash.Bytes(t.seed, b)&uint64(len(t.slots)-1)]
	if p := slot.Load(); p != nil {
		// The bytes after p were written before p was stored, and never
		// after: the string is as immutable as any.
		if s := unsafe.String((*byte)(unsafe.Add(unsafe.Pointer(p), 1)), int(*p)); s == string(b) {
			return s
		}
	}
	buf := make([]byte, 1+len(b))
	buf[0] = byte(len(b))
	copy(buf[1:], b)
	slot.Store(&buf[0])
	return unsafe.String(&buf[1], len(b))
}

// ipv6Bits is the IPv6 prefix length an IPv6Prefix setting means.
func ipv6Bits(b int) int {
	switch {
	case b == 0:
		return 64
	case b < 1:
		return 1
	case b > 128:
		return 128
	default:
		return b
	}
}

// trusted reports whether a (unmapped, without zone) is inside one of the
// trusted networks. A prefix written in IPv4-mapped form matches the IPv4
// addresses it maps.
func (c ClientIP) trusted(a netip.Addr) bool {
	for _, p := range c.TrustedProxies {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parsePeer parses RemoteAddr: "host:port" as net/http sets it, or a bare
// address as some middleware leaves it.
func parsePeer(s string) (netip.Addr, bool) {
	var a netip.Addr
	if ap, err := netip.ParseAddrPort(s); err == nil {
		a = ap.Addr()
	} else if b, err := netip.ParseAddr(s); err == nil {
		a = b
	} else {
		return netip.Addr{}, false
	}
	return a.WithZone("").Unmap(), true
}

// hop is one entry of a forwarded header: an address, or (ok false) an entry
// that names none.
type hop struct {
	addr netip.Addr
	ok   bool
}

// parseHops appends the hops of one header line to dst, keeping only the
// last cap(dst) of them, in order. Empty list elements are skipped, as RFC
// 9110 section 5.6.1 asks of recipients.
func parseHops(line string, forwarded bool, dst []hop) []hop {
	if !forwarded {
		// A plain list has no quoting: walk it from the right, which also
		// keeps the last hops without scanning more than needed.
		var rev [maxHops]hop
		n := 0
		for end := len(line); end >= 0 && n < cap(dst); {
			start := strings.LastIndexByte(line[:end], ',') + 1
			if elem := trimOWS(line[start:end]); elem != "" {
				a, ok := parseNode(elem)
				rev[n] = hop{a, ok}
				n++
			}
			end = start - 1
		}
		for i := n - 1; i >= 0; i-- {
			dst = append(dst, rev[i])
		}
		return dst
	}
	keep := func(h hop) {
		if len(dst) == cap(dst) {
			copy(dst, dst[1:])
			dst = dst[:len(dst)-1]
		}
		dst = append(dst, h)
	}
	for i := 0; i <= len(line); {
		var h hop
		var elem bool
		h.ok, elem, i = parseElement(line, i, &h.addr)
		if elem {
			keep(h)
		}
		i++ // past the ',' (or the end)
	}
	return dst
}

// parseElement parses one RFC 7239 forwarded-element of line starting at i
// and returns whether it named a usable client address (stored in *addr),
// whether the element was non-empty, and the index of the ',' ending it (or
// len(line)). An element without exactly one for= parameter, or with a
// syntax error, names no address. An unterminated quoted string runs to the
// end of the line.
func parseElement(line string, i int, addr *netip.Addr) (ok, nonEmpty bool, end int) {
	var forVal string
	nFor, bad := 0, false
	for {
		i = skipOWS(line, i)
		if i == len(line) || line[i] == ',' {
			break
		}
		nonEmpty = true
		if line[i] == ';' {
			i++
			continue
		}
		start := i
		for i < len(line) && isTchar(line[i]) {
			i++
		}
		name := line[start:i]
		if name == "" || i == len(line) || line[i] != '=' {
			bad = true
			i = skipElement(line, i)
			break
		}
		i++
		var val string
		if i < len(line) && line[i] == '"' {
			var closed bool
			val, i, closed = unquote(line, i)
			if !closed {
				bad = true
				break
			}
		} else {
			start = i
			for i < len(line) && isTchar(line[i]) {
				i++
			}
			val = line[start:i]
		}
		if strings.EqualFold(name, "for") {
			nFor++
			forVal = val
		}
		i = skipOWS(line, i)
		if i < len(line) && line[i] == ';' {
			i++
			continue
		}
		if i < len(line) && line[i] != ',' {
			bad = true
			i = skipElement(line, i)
			break
		}
	}
	if bad || nFor != 1 {
		return false, nonEmpty, i
	}
	a, ok := parseNode(forVal)
	*addr = a
	return ok, nonEmpty, i
}

// skipElement returns the index of the ',' that ends the element containing
// i, stepping over quoted strings, or len(line).
func skipElement(line string, i int) int {
	for i < len(line) {
		switch line[i] {
		case ',':
			return i
		case '"':
			_, i, _ = unquote(line, i)
		default:
			i++
		}
	}
	return i
}

// unquote reads the quoted-string starting at line[i] == '"'. It returns its
// content with quoted-pairs resolved, the index just past the closing quote
// (len(line) if there is none), and whether the string was closed.
func unquote(line string, i int) (string, int, bool) {
	start := i + 1
	escaped := false
	for j := start; j < len(line); j++ {
		switch line[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			s := line[start:j]
			if escaped {
				var b strings.Builder
				for k := 0; k < len(s); k++ {
					if s[k] == '\\' && k+1 < len(s) {
						k++
					}
					b.WriteByte(s[k])
				}
				s = b.String()
			}
			return s, j + 1, true
		}
	}
	return "", len(line), false
}

// parseNode parses a node as a forwarded header carries it: an IPv4 or IPv6
// address, either optionally with a port ("192.0.2.1:8080",
// "[2001:db8::1]:8080", the port's content ignored), or a bracketed IPv6
// address. Zoned addresses are refused: a zone means nothing off the host.
func parseNode(s string) (netip.Addr, bool) {
	var a netip.Addr
	var err error
	switch {
	case s == "":
		return netip.Addr{}, false
	case s[0] == '[':
		end := strings.IndexByte(s, ']')
		if end < 0 || (end+1 < len(s) && s[end+1] != ':') {
			return netip.Addr{}, false
		}
		a, err = netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
	default:
		a, err = netip.ParseAddr(s)
		if err != nil {
			// An IPv4 address with a port.
			c := strings.LastIndexByte(s, ':')
			if c < 0 {
				return netip.Addr{}, false
			}
			a, err = netip.ParseAddr(s[:c])
			if err != nil || !a.Is4() {
				return netip.Addr{}, false
			}
		}
	}
	if a.Zone() != "" {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func trimOWS(s string) string {
	return strings.Trim(s, " \t")
}

func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// isTchar reports whether c may appear in an RFC 9110 token.
func isTchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
