package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

var proxies = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("2001:db8:ffff::/48"),
}

func request(remote string, headers ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func TestClientIPAddr(t *testing.T) {
	const (
		xff  = "X-Forwarded-For"
		fwd  = "Forwarded"
		real = "X-Real-IP"
	)
	tests := []struct {
		name    string
		c       httplimit.ClientIP
		remote  string
		headers []string
		want    string
	}{
		// Nothing is trusted by default.
		{"no proxies: RemoteAddr", httplimit.ClientIP{}, "203.0.113.9:4711", nil, "203.0.113.9"},
		{"no proxies: a spoofed X-Forwarded-For changes nothing", httplimit.ClientIP{},
			"203.0.113.9:4711", []string{xff, "198.51.100.1"}, "203.0.113.9"},
		{"no proxies: a spoofed Forwarded changes nothing", httplimit.ClientIP{Header: fwd},
			"203.0.113.9:4711", []string{fwd, "for=198.51.100.1"}, "203.0.113.9"},
		{"untrusted peer: a spoofed X-Forwarded-For changes nothing", httplimit.ClientIP{TrustedProxies: proxies},
			"203.0.113.9:4711", []string{xff, "198.51.100.1, 10.0.0.2"}, "203.0.113.9"},
		{"untrusted peer: a spoofed X-Real-IP changes nothing", httplimit.ClientIP{TrustedProxies: proxies, Header: real},
			"203.0.113.9:4711", []string{real, "198.51.100.1"}, "203.0.113.9"},

		// X-Forwarded-For through trusted proxies.
		{"one trusted proxy", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "203.0.113.7"}, "203.0.113.7"},
		{"chain: the rightmost untrusted hop, not the client's own claim", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "198.51.100.1, 203.0.113.7, 10.0.0.2, 10.9.9.9"}, "203.0.113.7"},
		{"chain over several lines", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "198.51.100.1", xff, "203.0.113.7", xff, "10.0.0.2"}, "203.0.113.7"},
		{"every hop trusted: the leftmost", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		{"a trusted peer without the header is the client", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", nil, "10.0.0.1"},
		{"empty elements are skipped", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, " ,203.0.113.7,, \t,"}, "203.0.113.7"},
		{"an empty header is no header", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, ""}, "10.0.0.1"},
		{"IPv6 hops", httplimit.ClientIP{TrustedProxies: proxies},
			"[2001:db8:ffff::1]:443", []string{xff, "2001:db8:1:2::3, 2001:db8:ffff::2"}, "2001:db8:1:2::3"},
		{"hops with ports", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "[2001:db8::9]:1, 203.0.113.7:8080"}, "203.0.113.7"},
		{"bracketed IPv6 hop", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "[2001:db8::9]"}, "2001:db8::9"},
		{"IPv4-mapped hops are IPv4", httplimit.ClientIP{TrustedProxies: proxies},
			"[::ffff:10.0.0.1]:80", []string{xff, "::ffff:203.0.113.7, ::ffff:10.0.0.2"}, "203.0.113.7"},
		{"an IPv4-mapped trusted network", httplimit.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}},
			"10.0.0.1:80", []string{xff, "203.0.113.7"}, "203.0.113.7"},

		// Garbage never crashes and never lets a client pick its address.
		{"garbage where the client should be: the proxy that wrote it", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "203.0.113.7, not-an-address"}, "10.0.0.1"},
		{"garbage after a trusted hop: that hop", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "198.51.100.1, !!, 10.0.0.2"}, "10.0.0.2"},
		{"garbage left of the client is never reached", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "\x00\xff\"[[::, 203.0.113.7"}, "203.0.113.7"},
		{"a zoned address is garbage", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "fe80::1%eth0"}, "10.0.0.1"},
		{"unbalanced brackets are garbage", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "[2001:db8::9"}, "10.0.0.1"},
		{"a port after brackets only", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "[2001:db8::9]x"}, "10.0.0.1"},
		{"a bracketed IPv4 is garbage", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "[203.0.113.7]"}, "10.0.0.1"},
		{"a long chain of trusted hops ends at the last one examined", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{xff, "203.0.113.7, " + strings.Repeat("10.0.0.2, ", 40) + "10.0.0.3"}, "10.0.0.2"},

		// Only the configured header is read.
		{"X-Forwarded-For is ignored when proxies write Forwarded", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{xff, "198.51.100.1", fwd, "for=203.0.113.7"}, "203.0.113.7"},
		{"Forwarded is ignored when proxies write X-Forwarded-For", httplimit.ClientIP{TrustedProxies: proxies},
			"10.0.0.1:80", []string{fwd, "for=198.51.100.1", xff, "203.0.113.7"}, "203.0.113.7"},
		{"X-Real-IP", httplimit.ClientIP{TrustedProxies: proxies, Header: real},
			"10.0.0.1:80", []string{xff, "198.51.100.1", real, "203.0.113.7"}, "203.0.113.7"},
		{"the header name is case-insensitive", httplimit.ClientIP{TrustedProxies: proxies, Header: "x-real-ip"},
			"10.0.0.1:80", []string{real, "203.0.113.7"}, "203.0.113.7"},

		// RFC 7239.
		{"Forwarded", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, "for=203.0.113.7;proto=https;by=10.0.0.1"}, "203.0.113.7"},
		{"Forwarded: parameter names are case-insensitive", httplimit.ClientIP{TrustedProxies: proxies, Header: "forwarded"},
			"10.0.0.1:80", []string{fwd, "Proto=https; FOR=203.0.113.7"}, "203.0.113.7"},
		{"Forwarded: quoted IPv6 with a port", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, `for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"Forwarded: quoted IPv4 with an obfuscated port", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, `for="203.0.113.7:_p1"`}, "203.0.113.7"},
		{"Forwarded: quoted-pairs", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, `for="203.0.113.\7"`}, "203.0.113.7"},
		{"Forwarded: chain", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, `for=198.51.100.1, for=203.0.113.7;proto=http, for="[2001:db8:ffff::5]"`}, "203.0.113.7"},
		{"Forwarded: chain over lines", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, `for=198.51.100.1`, fwd, `for=203.0.113.7`, fwd, `for=10.0.0.2`}, "203.0.113.7"},
		{"Forwarded: commas and semicolons inside quotes", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, `for=198.51.100.1;ext=",for=1.1.1.1;", for=203.0.113.7`}, "203.0.113.7"},
		{"Forwarded: unknown ends the walk", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, "for=203.0.113.7, for=unknown"}, "10.0.0.1"},
		{"Forwarded: an obfuscated node ends the walk", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, "for=203.0.113.7, for=_hidden, for=10.0.0.2"}, "10.0.0.2"},
		{"Forwarded: an element without for ends the walk", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, "for=203.0.113.7, proto=https"}, "10.0.0.1"},
		{"Forwarded: two for parameters in one element", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, "for=203.0.113.7;for=198.51.100.1"}, "10.0.0.1"},
		{"Forwarded: unquoted IPv6 is a syntax error", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, "for=2001:db8::1"}, "10.0.0.1"},
		{"Forwarded: an unterminated quote swallows its line", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, `for="198.51.100.1, for=203.0.113.7`}, "10.0.0.1"},
		{"Forwarded: ... but not the proxy's own line", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, `for="198.51.100.1`, fwd, `for=203.0.113.7`}, "203.0.113.7"},
		{"Forwarded: garbage left of the client", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, `=;;\,,for=, for=203.0.113.7`}, "203.0.113.7"},
		{"Forwarded: empty elements and pairs", httplimit.ClientIP{TrustedProxies: proxies, Header: fwd},
			"10.0.0.1:80", []string{fwd, `,, for=203.0.113.7;; ,`}, "203.0.113.7"},

		// RemoteAddr forms.
		{"a bare RemoteAddr", httplimit.ClientIP{}, "203.0.113.9", nil, "203.0.113.9"},
		{"a zoned RemoteAddr loses its zone", httplimit.ClientIP{}, "[fe80::1%eth0]:80", nil, "fe80::1"},
		{"an IPv4-mapped RemoteAddr is IPv4", httplimit.ClientIP{}, "[::ffff:203.0.113.9]:80", nil, "203.0.113.9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.c.Addr(request(tt.remote, tt.headers...))
			require.NoError(t, err)
			assert.Equal(t, netip.MustParseAddr(tt.want), got)
		})
	}
}

func TestClientIPNoAddress(t *testing.T) {
	for _, remote := range []string{"", "@", "/run/app.sock", "example.com:80", "[::1"} {
		_, err := httplimit.ClientIP{TrustedProxies: proxies}.Addr(request(remote, "X-Forwarded-For", "203.0.113.7"))
		assert.ErrorIs(t, err, httplimit.ErrNoClientAddr, "%q", remote)
		_, err = httplimit.ClientIP{}.Key(request(remote))
		assert.ErrorIs(t, err, httplimit.ErrNoClientAddr, "%q", remote)
	}
}

func TestClientIPKey(t *testing.T) {
	tests := []struct {
		name   string
		prefix int
		remote string
		want   string
	}{
		{"IPv4 whole", 0, "203.0.113.9:1", "ip:203.0.113.9"},
		{"IPv4 ignores the IPv6 prefix", 8, "203.0.113.9:1", "ip:203.0.113.9"},
		{"IPv6 by /64 by default", 0, "[2001:db8:1:2:3:4:5:6]:1", "ip:2001:db8:1:2::/64"},
		{"IPv6 by /48", 48, "[2001:db8:1:2:3:4:5:6]:1", "ip:2001:db8:1::/48"},
		{"IPv6 whole", 128, "[2001:db8:1:2:3:4:5:6]:1", "ip:2001:db8:1:2:3:4:5:6/128"},
		{"clamped above", 500, "[2001:db8:1:2:3:4:5:6]:1", "ip:2001:db8:1:2:3:4:5:6/128"},
		{"clamped below", -3, "[2001:db8:1:2:3:4:5:6]:1", "ip:::/1"},
		{"IPv6 by /56, as express groups", 56, "[2001:db8:1:2ff:3:4:5:6]:1", "ip:2001:db8:1:200::/56"},
		{"IPv6 by /56, the next /56", 56, "[2001:db8:1:300::1]:1", "ip:2001:db8:1:300::/56"},
		{"IPv6 by /32", 32, "[2001:db8:1:2::1]:1", "ip:2001:db8::/32"},
		{"IPv6 by /1", 1, "[ffff::1]:1", "ip:8000::/1"},
		{"IPv4-mapped is IPv4, by /64", 0, "[::ffff:198.51.100.7]:1", "ip:198.51.100.7"},
		{"IPv4-mapped is IPv4, by /56", 56, "[::ffff:198.51.100.7]:1", "ip:198.51.100.7"},
		{"IPv4-mapped is IPv4, by /128", 128, "[::ffff:198.51.100.7]:1", "ip:198.51.100.7"},
		{"IPv4-mapped bare", 56, "::ffff:198.51.100.7", "ip:198.51.100.7"},
		{"IPv4-compatible is IPv6", 56, "[::198.51.100.7]:1", "ip:::/56"},
		{"zone dropped", 56, "[fe80::1%eth0]:1", "ip:fe80::/56"},
		// The prefix applies to a client found in a forwarded header too
		// (after "|": the header's value, sent by the trusted 10.0.0.1),
		// and a forwarded IPv4-mapped address is IPv4.
		{"forwarded IPv6 by /64", 0, "|2001:db8:1:2ff::9", "ip:2001:db8:1:2ff::/64"},
		{"forwarded IPv6 by /56", 56, "|2001:db8:1:2ff::9", "ip:2001:db8:1:200::/56"},
		{"forwarded IPv6 with port by /56", 56, "|[2001:db8:1:2ff::9]:443", "ip:2001:db8:1:200::/56"},
		{"forwarded IPv4-mapped by /56", 56, "|::ffff:203.0.113.7", "ip:203.0.113.7"},
		{"forwarded IPv4 by /56", 56, "|203.0.113.7", "ip:203.0.113.7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, r := httplimit.ClientIP{IPv6Prefix: tt.prefix}, request(tt.remote)
			if fwd, ok := strings.CutPrefix(tt.remote, "|"); ok {
				c.TrustedProxies, r = proxies, request("10.0.0.1:80", "X-Forwarded-For", fwd)
			}
			k, err := c.Key(r)
			require.NoError(t, err)
			assert.Equal(t, tt.want, k)
		})
	}
}

// TestIPv6Grouping checks through the middleware that one /64 shares one
// allowance.
func TestIPv6Grouping(t *testing.T) {
	f := newFixture(t, ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1})
	assert.Equal(t, http.StatusOK, f.do(from("[2001:db8:1:2::1]:1")).Code)
	assert.Equal(t, http.StatusTooManyRequests, f.do(from("[2001:db8:1:2:ffff::9]:1")).Code, "same /64")
	assert.Equal(t, http.StatusOK, f.do(from("[2001:db8:1:3::1]:1")).Code, "next /64")

	f = newFixture(t, ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1},
		httplimit.WithKey(httplimit.ClientIP{IPv6Prefix: 128}.Key))
	assert.Equal(t, http.StatusOK, f.do(from("[2001:db8:1:2::1]:1")).Code)
	assert.Equal(t, http.StatusOK, f.do(from("[2001:db8:1:2::2]:1")).Code)

	// By /56: a subscriber's whole /56 shares one allowance; an
	// IPv4-mapped peer shares its IPv4 address's.
	f = newFixture(t, ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1},
		httplimit.WithKey(httplimit.ClientIP{IPv6Prefix: 56}.Key))
	assert.Equal(t, http.StatusOK, f.do(from("[2001:db8:1:200::1]:1")).Code)
	assert.Equal(t, http.StatusTooManyRequests, f.do(from("[2001:db8:1:2ff:ffff::1]:1")).Code, "same /56")
	assert.Equal(t, http.StatusOK, f.do(from("[2001:db8:1:300::1]:1")).Code, "next /56")
	assert.Equal(t, http.StatusOK, f.do(from("198.51.100.7:1")).Code)
	assert.Equal(t, http.StatusTooManyRequests, f.do(from("[::ffff:198.51.100.7]:1")).Code, "IPv4-mapped is the IPv4 address")
}

// TestProxiesThroughMiddleware runs the proxy cases end to end: a spoofed
// header from an untrusted peer spends that peer's allowance.
func TestProxiesThroughMiddleware(t *testing.T) {
	f := newFixture(t, ratelimit.TokenBucket{Rate: ratelimit.PerHour(1), Burst: 1},
		httplimit.WithKey(httplimit.ClientIP{TrustedProxies: proxies}.Key))
	assert.Equal(t, http.StatusOK, f.do(from("203.0.113.9:1"), header("X-Forwarded-For", "198.51.100.1")).Code)
	assert.Equal(t, http.StatusTooManyRequests, f.do(from("203.0.113.9:1"), header("X-Forwarded-For", "198.51.100.2")).Code,
		"changing the spoofed header does not buy a new allowance")
	assert.Equal(t, http.StatusOK, f.do(from("10.0.0.1:1"), header("X-Forwarded-For", "203.0.113.7")).Code)
	assert.Equal(t, http.StatusTooManyRequests, f.do(from("10.0.0.2:1"), header("X-Forwarded-For", "198.51.100.1, 203.0.113.7")).Code,
		"the same client through another proxy, claiming to be someone else")
	assert.Equal(t, http.StatusTooManyRequests, f.do(from("10.0.0.1:1"), header("X-Forwarded-For", "203.0.113.9")).Code,
		"the untrusted peer from before, now behind the proxy")
}
