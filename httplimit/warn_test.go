package httplimit_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// warnFixture is a middleware whose warnings (and nothing else) go to a
// buffer, with the checks looking at every request.
func warnFixture(t *testing.T, opts ...httplimit.Option) (http.Handler, *syncBuffer) {
	t.Helper()
	httplimit.WatchEveryRequest(true)
	t.Cleanup(func() { httplimit.WatchEveryRequest(false) })
	logs := &syncBuffer{}
	store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerSecond(1_000_000), Burst: 1_000_000})
	require.NoError(t, err)
	opts = append([]httplimit.Option{httplimit.WithWarnings(slog.New(slog.NewJSONHandler(logs, nil)))}, opts...)
	return httplimit.Middleware(store, opts...)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})), logs
}

func send(h http.Handler, n int, mods ...func(*http.Request)) {
	for range n {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		for _, m := range mods {
			m(r)
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
}

// TestWarnForwardedUntrusted: requests that carry a forwarded header but
// are keyed by their peer's address are warned about once per process,
// not per request, whatever the number of middlewares; none is written
// when the proxy is trusted or the header absent, or with warnings off.
func TestWarnForwardedUntrusted(t *testing.T) {
	trusted := httplimit.WithKey(httplimit.ClientIP{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}.Key)
	h, logs := warnFixture(t, trusted)
	send(h, 50, from("10.0.0.1:1"), header("X-Forwarded-For", "203.0.113.7"))
	plain, _ := warnFixture(t)
	send(plain, 50, from("10.0.0.1:1"))
	off, _ := warnFixture(t, httplimit.WithWarnings(nil))
	send(off, 50, from("10.0.0.1:1"), header("X-Forwarded-For", "203.0.113.7"))
	assert.Empty(t, logs.String())

	h, logs = warnFixture(t)
	other, otherLogs := warnFixture(t, httplimit.WithKey(httplimit.HeaderKey("X-API-Key", httplimit.ClientIP{IPv6Prefix: 56}.Key)))
	httplimit.WatchEveryRequest(true) // from here on, one warning for the process
	for range 10 {
		send(h, 100, from("10.0.0.1:1"), header("X-Forwarded-For", "203.0.113.7"))
		send(other, 100, from("[2001:db8::1]:1"), header("Forwarded", "for=203.0.113.7"))
	}
	lines := logs.lines(t)
	require.Len(t, lines, 1, "one warning, not one per request")
	assert.Equal(t, "WARN", lines[0]["level"])
	assert.Equal(t, "httplimit: forwarded requests keyed by their peer", lines[0]["msg"])
	assert.Equal(t, "ip:10.0.0.1", lines[0]["key"])
	assert.Empty(t, otherLogs.String(), "once per process")

	// The IPv6 key is a prefix holding the peer.
	other, otherLogs = warnFixture(t, httplimit.WithKey(httplimit.HeaderKey("X-API-Key", httplimit.ClientIP{IPv6Prefix: 56}.Key)))
	send(other, 1, from("[2001:db8::1]:1"), header("Forwarded", "for=203.0.113.7"))
	require.Len(t, otherLogs.lines(t), 1)
	assert.Equal(t, "ip:2001:db8::/56", otherLogs.lines(t)[0]["key"])
}

// TestWarnSharedAddress: one address taking most requests from many user
// agents is warned about once; an address with one agent, or traffic
// spread over addresses, is not.
func TestWarnSharedAddress(t *testing.T) {
	h, logs := warnFixture(t)
	send(h, 500, from("192.0.2.1:1"), header("User-Agent", "one-client/1.0"))
	for i := range 500 {
		send(h, 1, from("192.0.2."+strconv.Itoa(i%200+1)+":1"), header("User-Agent", "agent/"+strconv.Itoa(i)))
	}
	assert.Empty(t, logs.String())

	for i := range 2000 {
		send(h, 1, from("192.0.2.9:1"), header("User-Agent", "agent/"+strconv.Itoa(i%20)))
		send(h, 1, from("198.51.100."+strconv.Itoa(i%50+1)+":1"))
	}
	lines := logs.lines(t)
	require.Len(t, lines, 1, "one warning, not one per request or per window")
	assert.Equal(t, "httplimit: one address takes most requests, from many user agents", lines[0]["msg"])
	assert.Equal(t, "ip:192.0.2.9", lines[0]["key"])
}

// TestWarningsSampled: by default the checks look at a sample of
// requests, and still warn, once.
func TestWarningsSampled(t *testing.T) {
	h, logs := warnFixture(t)
	httplimit.WatchEveryRequest(false)
	send(h, 5000, from("10.0.0.1:1"), header("X-Forwarded-For", "203.0.113.7"))
	assert.Len(t, logs.lines(t), 1)
}
