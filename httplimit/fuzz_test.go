package httplimit_test

import (
	"net/netip"
	"testing"

	"github.com/ratekit/ratelimit/httplimit"
)

// FuzzClientAddr feeds arbitrary RemoteAddr values and forwarded-header lines
// to ClientIP. Whatever the input, it must not panic, must ignore the header
// when the peer is not trusted, and must not let the header's author override
// what a trusted proxy appended after it.
func FuzzClientAddr(f *testing.F) {
	f.Add("10.0.0.1:80", "203.0.113.7", uint8(0), 0)
	f.Add("203.0.113.9:4711", "198.51.100.1, 10.0.0.2", uint8(0), 64)
	f.Add("[2001:db8:ffff::1]:443", "[2001:db8::9]:1, 2001:db8:1:2::3", uint8(0), 48)
	f.Add("10.0.0.1:80", `for="[2001:db8:cafe::17]:4711";proto=https, for=unknown`, uint8(1), 0)
	f.Add("10.0.0.1:80", `for="198.51.100.1`, uint8(1), 0)
	f.Add("10.0.0.1:80", `=;;\,,for=, For="_x:_y";by=10.0.0.1`, uint8(1), 128)
	f.Add("[::ffff:10.0.0.1]:80", "::ffff:203.0.113.7", uint8(2), 0)
	f.Add("[fe80::1%eth0]:80", "fe80::1%eth0, ,,", uint8(0), -1)
	f.Add("@", "", uint8(0), 0)

	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	headers := []string{"X-Forwarded-For", "Forwarded", "X-Real-IP"}
	// What a trusted proxy appends for client 203.0.113.7, in each syntax.
	appended := []string{"203.0.113.7", "for=203.0.113.7", "203.0.113.7"}
	client := netip.MustParseAddr("203.0.113.7")
	proxy := netip.MustParseAddr("10.0.0.1")

	f.Fuzz(func(t *testing.T, remote, line string, mode uint8, v6 int) {
		m := int(mode) % len(headers)
		name := headers[m]

		// Any input: no panic, and an untrusted peer is the client.
		plain := httplimit.ClientIP{Header: name, IPv6Prefix: v6}
		peer, err := plain.Addr(request(remote))
		got, err2 := httplimit.ClientIP{Header: name, IPv6Prefix: v6}.Addr(request(remote, name, line))
		if (err == nil) != (err2 == nil) || got != peer {
			t.Fatalf("without trusted proxies the header changed the client: %v, %v -> %v, %v", peer, err, got, err2)
		}
		if _, err := plain.Key(request(remote, name, line)); (err == nil) != (err2 == nil) {
			t.Fatalf("Key and Addr disagree: %v, %v", err, err2)
		}
		withProxies := httplimit.ClientIP{TrustedProxies: trusted, Header: name, IPv6Prefix: v6}
		a, err := withProxies.Addr(request(remote, name, line))
		if err == nil && !a.IsValid() {
			t.Fatalf("no error and no address")
		}
		if err == nil && !trustedPeer(trusted, peer) && a != peer {
			t.Fatalf("an untrusted peer's header was read: peer %v, got %v", peer, a)
		}

		// A trusted proxy appends its own line after the client's: the
		// client's line cannot override it.
		got, err = withProxies.Addr(request("10.0.0.1:80", name, line, name, appended[m]))
		if err != nil || got != client {
			t.Fatalf("appended line overridden: got %v, %v", got, err)
		}
		// Appended to the same line, only an unterminated quote in the
		// client's part can hide it, and then the proxy is the client.
		got, err = withProxies.Addr(request("10.0.0.1:80", name, line+","+appended[m]))
		if err != nil || (got != client && (m != 1 || got != proxy)) {
			t.Fatalf("appended element overridden: got %v, %v", got, err)
		}
	})
}

func trustedPeer(trusted []netip.Prefix, a netip.Addr) bool {
	for _, p := range trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
