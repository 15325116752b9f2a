package httplimit

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/wide"
)

// defaultPolicy names the policy of a rule without a Name, as the draft's
// own examples do.
const defaultPolicy = "default"

func policyName(d ratelimit.Decision) string {
	if d.Policy == "" {
		return defaultPolicy
	}
	return d.Policy
}

// maxSFInt is the largest Integer a structured field (RFC 9651) may carry.
const maxSFInt = 999_999_999_999_999

// layered is a keyed limiter that can tell every enforced layer's Decision,
// as [ratelimit.Composite] and [ratelimit.Plans] can: the middleware asks
// it instead of CheckContext or CheckWithin, so that the RateLimit fields
// list every limit the request is subject to.
type layered interface {
	CheckLayers(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration, dst []ratelimit.Decision) (ratelimit.Decision, []ratelimit.Decision, error)
}

// layerBufs lends the slices a layered limiter appends its layers to, so
// that asking it allocates nothing.
var layerBufs = sync.Pool{New: func() any { return new([8]ratelimit.Decision) }}

// partition computes the pk parameter ([WithPartitionKey]): the first
// pkLen bytes of HMAC-SHA256 of the request's key, under a secret.
type partition struct {
	ipad, opad [sha256.BlockSize]byte
	secret     []byte // for keys too long for the stack buffer
}

// pkLen is how many bytes of the keyed hash pk carries: enough to tell a
// client's partitions apart, too few to be a useful digest of the key.
const pkLen = 8

func newPartition(secret []byte) *partition {
	p := &partition{secret: append([]byte(nil), secret...)}
	k := secret
	if len(k) > sha256.BlockSize {
		sum := sha256.Sum256(k)
		k = sum[:]
	}
	for i := range sha256.BlockSize {
		var b byte
		if i < len(k) {
			b = k[i]
		}
		p.ipad[i] = b ^ 0x36
		p.opad[i] = b ^ 0x5c
	}
	return p
}

// sum returns the partition key of key. It is HMAC-SHA256 (RFC 2104),
// computed from the pads on the stack so that it allocates nothing for
// keys of up to 1 KiB.
func (p *partition) sum(key string) [pkLen]byte {
	var out [pkLen]byte
	if len(key) > 1024 {
		m := hmac.New(sha256.New, p.secret)
		m.Write([]byte(key))
		copy(out[:], m.Sum(nil))
		return out
	}
	var in [sha256.BlockSize + 1024]byte
	copy(in[:], p.ipad[:])
	n := copy(in[sha256.BlockSize:], key)
	inner := sha256.Sum256(in[:sha256.BlockSize+n])
	var o [sha256.BlockSize + sha256.Size]byte
	copy(o[:], p.opad[:])
	copy(o[sha256.BlockSize:], inner[:])
	outer := sha256.Sum256(o[:])
	copy(out[:], outer[:])
	return out
}

// appendPK appends the pk parameter for pk, if it is not nil.
func appendPK(buf []byte, pk *[pkLen]byte) []byte {
	if pk == nil {
		return buf
	}
	buf = append(buf, ";pk=:"...)
	buf = base64.StdEncoding.AppendEncode(buf, pk[:])
	return append(buf, ':')
}

// AppendPolicyList appends to buf the value of the RateLimit-Policy field
// the middleware sends for a request decided d: an item for each of layers
// (the Decisions of every enforced layer, which a [ratelimit.Composite] or
// a [ratelimit.Plans] gives with CheckLayers), or the one item of d when
// layers is empty (see [AppendPolicyField]). It is for other protocols'
// middleware (such as gRPC metadata) to send the same.
func AppendPolicyList(buf []byte, d ratelimit.Decision, layers []ratelimit.Decision) []byte {
	return appendPolicyList(buf, d, layers, nil)
}

// AppendLimitList appends to buf the value of the RateLimit field the
// middleware sends for a request decided d with layers, as seen elapsed
// after the decision was made, as [AppendPolicyList] does for
// RateLimit-Policy (see [AppendLimitField]).
func AppendLimitList(buf []byte, d ratelimit.Decision, layers []ratelimit.Decision, elapsed time.Duration) []byte {
	return appendLimitList(buf, d, layers, elapsed, nil)
}

// appendPolicyList appends the RateLimit-Policy value: an item for each of
// layers, or for d alone when there are none, each with pk if it is not
// nil.
func appendPolicyList(buf []byte, d ratelimit.Decision, layers []ratelimit.Decision, pk *[pkLen]byte) []byte {
	if len(layers) == 0 {
		return appendPK(AppendPolicyField(buf, d), pk)
	}
	for i, l := range layers {
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf = appendPK(AppendPolicyField(buf, l), pk)
	}
	return buf
}

// appendLimitList appends the RateLimit value, as seen elapsed after the
// decision: an item for each of layers, or for d alone when there are
// none.
func appendLimitList(buf []byte, d ratelimit.Decision, layers []ratelimit.Decision, elapsed time.Duration, pk *[pkLen]byte) []byte {
	if len(layers) == 0 {
		return appendPK(AppendLimitField(buf, d, elapsed), pk)
	}
	for i, l := range layers {
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf = appendPK(AppendLimitField(buf, l, elapsed), pk)
	}
	return buf
}

// setFields sets the RateLimit-Policy and RateLimit fields (and the legacy
// ones) of an admitted request for d and its layers, as seen elapsed after
// the decision was made. The header map is written directly under the
// canonical names, and both values and the two one-element slices holding
// them share one allocation (see newBlock), so that an admitted request's
// fields cost one allocation.
func (c *config) setFields(h http.Header, d ratelimit.Decision, layers []ratelimit.Decision, pk *[pkLen]byte, elapsed time.Duration) {
	if d.Window <= 0 {
		return // an in-flight limit's: not a quota over time (see InFlight)
	}
	var stack [256]byte
	buf := stack[:0]
	memo := c.memoPolicy(d, layers, pk)
	if memo == "" {
		buf = appendPolicyList(buf, d, layers, pk)
	}
	split := len(buf)
	buf = appendLimitList(buf, d, layers, elapsed, pk)
	vals, b := newBlock(2, len(buf))
	n := copy(b, buf)
	vals[0] = memo
	if memo == "" {
		vals[0] = unsafe.String(&b[0], split)
	}
	vals[1] = unsafe.String(&b[split], n-split)
	h["Ratelimit-Policy"] = vals[0:1:1]
	h["Ratelimit"] = vals[1:2:2]
	if c.legacy {
		setLegacy(h, d, elapsed)
	}
}

// policyMemo is a RateLimit-Policy value made for one rule: it depends on
// the rule alone, so a middleware keeps the ones it made last in a small
// table (policyMemos), and a request of the same rule sends one again
// without making it.
type policyMemo struct {
	policy string
	limit  int64
	window time.Duration
	value  string
}

// policyMemos is a direct-mapped table of policyMemo: a few rules (the
// plans of a Plans) each keep a slot, unless they collide.
type policyMemos [16]atomic.Pointer[policyMemo]

// memoPolicy returns the RateLimit-Policy value for d, from the memo or
// made and kept there, or "" when the value is not one rule's alone
// (several layers, or a pk, which depends on the key).
func (c *config) memoPolicy(d ratelimit.Decision, layers []ratelimit.Decision, pk *[pkLen]byte) string {
	if len(layers) > 1 || pk != nil || c.memo == nil {
		return ""
	}
	if len(layers) == 1 {
		d = layers[0]
	}
	slot := &c.memo[(uint64(d.Limit)^uint64(d.Window)>>20^uint64(len(d.Policy)))%uint64(len(c.memo))]
	if m := slot.Load(); m != nil && m.limit == d.Limit && m.window == d.Window && m.policy == d.Policy {
		return m.value
	}
	m := &policyMemo{policy: d.Policy, limit: d.Limit, window: d.Window, value: policyField(d)}
	slot.Store(m)
	return m.value
}

// setLegacy sets the X-RateLimit fields (WithLegacyHeaders).
func setLegacy(h http.Header, d ratelimit.Decision, elapsed time.Duration) {
	reset := ceilDiv(max(0, d.ResetAfter-elapsed), time.Second)
	h.Set("X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(d.Remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(reset, 10))
}

// Blocks of one allocation each, holding the values of a response's
// fields (b) and the slice elements that carry them (vals): smallFields
// and largeFields an admission's RateLimit fields, refusalFields a
// refusal's fields and body (see refuse). The arrays' lengths are what a
// short policy name fits in; a longer one takes a second allocation.
type (
	smallFields struct {
		vals [2]string
		b    [64]byte
	}
	largeFields struct {
		vals [2]string
		b    [224]byte
	}
	refusalFields struct {
		vals [refusalVals]string
		b    [224]byte
	}
)

// refusalVals is how many field values a refusal sets: RateLimit-Policy,
// RateLimit, Retry-After, Cache-Control, Content-Type and
// X-Content-Type-Options.
const refusalVals = 6

// newBlock returns n (at most 2) values and size bytes for them, in one
// allocation when they fit a block, and in two otherwise. The values' strings are to
// point into the bytes, which the caller writes once, before it makes
// them, and never again: they are as immutable as any string, and keep the
// block alive while a header holds one.
func newBlock(n, size int) ([]string, []byte) {
	switch {
	case n <= 2 && size <= len(smallFields{}.b):
		blk := new(smallFields)
		return blk.vals[:n], blk.b[:size]
	case n <= 2 && size <= len(largeFields{}.b):
		blk := new(largeFields)
		return blk.vals[:n], blk.b[:size]
	}
	return make([]string, n), make([]byte, size)
}

// policyField is the RateLimit-Policy value for d's rule.
func policyField(d ratelimit.Decision) string {
	return string(AppendPolicyField(nil, d))
}

// AppendLimitField appends to buf the value of the RateLimit field for d,
// as seen elapsed after the decision was made (an admitted request's Delay,
// once waited out): "<policy>";r=<Remaining>;t=<seconds until the
// allowance is whole, rounded up>. It is what the middleware sends for a
// single rule, for other protocols' middleware (such as gRPC metadata) to
// send the same.
func AppendLimitField(buf []byte, d ratelimit.Decision, elapsed time.Duration) []byte {
	buf = appendSFString(buf, policyName(d))
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, min(max(0, d.Remaining), maxSFInt), 10)
	buf = append(buf, ";t="...)
	return strconv.AppendInt(buf, min(ceilDiv(max(0, d.ResetAfter-elapsed), time.Second), maxSFInt), 10)
}

// AppendPolicyField appends to buf the value of the RateLimit-Policy field
// for d's rule: "<policy>";q=<quota>;w=<window>, where w is the Window in
// whole seconds, rounded up (a positive integer, as the field needs), and q
// the quota the rule grants over w, Limit x w / Window rounded to the
// nearest integer, so that q/w is the rule's rate (see the package doc).
// The policy is the rule's Name, or "default".
func AppendPolicyField(buf []byte, d ratelimit.Decision) []byte {
	w := min(max(1, ceilDiv(d.Window, time.Second)), maxSFInt)
	q := max(0, d.Limit)
	if d.Window > 0 && d.Window != time.Duration(w)*time.Second {
		n, r, ok := wide.MulDiv(uint64(q), uint64(w)*uint64(time.Second), uint64(d.Window))
		if r >= uint64(d.Window)-r {
			n++
		}
		q = maxSFInt
		if ok && n < maxSFInt {
			q = int64(n)
		}
	}
	buf = appendSFString(buf, policyName(d))
	buf = append(buf, ";q="...)
	buf = strconv.AppendInt(buf, min(q, maxSFInt), 10)
	buf = append(buf, ";w="...)
	return strconv.AppendInt(buf, w, 10)
}

// appendSFString appends s as a structured-field String: quoted, with '"'
// and '\' escaped; bytes outside printable ASCII, which a String cannot
// carry, are replaced by '?'.
func appendSFString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			buf = append(buf, '\\', c)
		case c < 0x20 || c > 0x7e:
			buf = append(buf, '?')
		default:
			buf = append(buf, c)
		}
	}
	return append(buf, '"')
}
