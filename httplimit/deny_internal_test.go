package httplimit

import (
	"crypto/hmac"
	"crypto/sha256"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

// TestAppendMillis: the wait in the default body reads as Duration.String
// writes it, for every magnitude.
func TestAppendMillis(t *testing.T) {
	for _, ms := range []int64{0, 1, 9, 10, 999, 1000, 1001, 1010, 1100, 1500, 59_999, 60_000, 60_001, 61_000,
		3_599_999, 3_600_000, 3_600_001, 3_661_001, 86_400_000, math.MaxInt64 / int64(time.Millisecond)} {
		assert.Equal(t, (time.Duration(ms) * time.Millisecond).String(), string(appendMillis(nil, ms)), "%d ms", ms)
	}
	rapid.Check(t, func(t *rapid.T) {
		ms := rapid.Int64Range(0, math.MaxInt64/int64(time.Millisecond)).Draw(t, "ms")
		if got, want := string(appendMillis(nil, ms)), (time.Duration(ms) * time.Millisecond).String(); got != want {
			t.Fatalf("%d ms: %q, want %q", ms, got, want)
		}
	})
}

// TestAppendDenialIsDeny: the body built without encoding/json is the one
// the default DeniedHandler encodes, byte for byte, for every name it
// takes and every wait; other names are left to the handler.
func TestAppendDenialIsDeny(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := ratelimit.Decision{
			Policy:     rapid.StringMatching(`[ -~]{0,30}|[a-z\x00-\x7f\x{e9}\x{2028}]{0,8}`).Draw(t, "policy"),
			RetryAfter: time.Duration(rapid.Int64Range(0, math.MaxInt64).Draw(t, "retry")),
		}
		w := httptest.NewRecorder()
		deny(w, nil, d)
		got, ok := appendDenial(nil, d)
		plain := !strings.ContainsAny(policyName(d), "\"\\<>&") && strings.IndexFunc(policyName(d), func(r rune) bool { return r < 0x20 || r > 0x7e }) < 0
		fits := ceilDiv(d.RetryAfter, time.Millisecond) <= math.MaxInt64/int64(time.Millisecond)
		if ok != (plain && fits) {
			t.Fatalf("policy %q, wait %v: built %v", d.Policy, d.RetryAfter, ok)
		}
		if ok && string(got) != w.Body.String() {
			t.Fatalf("policy %q, wait %v:\n%s\nwant\n%s", d.Policy, d.RetryAfter, got, w.Body.String())
		}
	})
}

// TestPartitionSum: the partition key is HMAC-SHA256, truncated, for
// secrets and keys of every length.
func TestPartitionSum(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		secret := rapid.SliceOfN(rapid.Byte(), 1, 200).Draw(t, "secret")
		key := rapid.StringN(0, -1, 1100).Draw(t, "key")
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(key))
		want := m.Sum(nil)[:pkLen]
		got := newPartition(secret).sum(key)
		if string(got[:]) != string(want) {
			t.Fatalf("secret %x key %q: %x, want %x", secret, key, got, want)
		}
	})
	long := strings.Repeat("k", 2000)
	m := hmac.New(sha256.New, []byte("s"))
	m.Write([]byte(long))
	got := newPartition([]byte("s")).sum(long)
	assert.Equal(t, m.Sum(nil)[:pkLen], got[:])
}

// TestRefuseOutgrowsItsBlock: fields and a body longer than the refusal's
// block are whole.
func TestRefuseOutgrowsItsBlock(t *testing.T) {
	name := strings.Repeat("n", 300)
	h := &handler{config: config{denied: deny, defaultDenied: true}}
	w := httptest.NewRecorder()
	d := ratelimit.Decision{Policy: name, Limit: 1, Window: time.Second, RetryAfter: time.Second, ResetAfter: time.Second}
	h.refuse(w, httptest.NewRequest(http.MethodGet, "/", nil), d, nil, nil)
	want := httptest.NewRecorder()
	deny(want, nil, d)
	require.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, want.Body.String(), w.Body.String())
	assert.Equal(t, `"`+name+`";q=1;w=1`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"`+name+`";r=0;t=1`, w.Header().Get("RateLimit"))
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
}
