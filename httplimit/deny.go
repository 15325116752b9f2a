package httplimit

import (
	"math"
	"net/http"
	"strconv"
	"time"
	"unsafe"

	"github.com/ratekit/ratelimit"
)

// refuse answers a request over its limit: the RateLimit fields of d (and
// its layers), Retry-After and Cache-Control: no-store, then the
// DeniedHandler. With the default DeniedHandler the fields and the body
// are built together, with their header slices, in one allocation, and
// the body written from it: a client over its limit is the cheap path of
// a server under attack. The body is the bytes the default
// handler's JSON encoding gives, built without encoding/json for a policy
// name that needs no escaping (see appendDenial); any other name takes
// that handler itself.
func (h *handler) refuse(w http.ResponseWriter, r *http.Request, d ratelimit.Decision, layers []ratelimit.Decision, pk *[pkLen]byte) {
	fields := d.Window > 0 // not an in-flight limit's (see InFlight)
	// The values are written straight into the block; one that outgrows
	// it moves to a buffer of its own, a second allocation.
	blk := new(refusalFields)
	vals, buf := blk.vals[:], blk.b[:0]
	var policyEnd, limitEnd int
	if fields {
		if memo := h.memoPolicy(d, layers, pk); memo != "" {
			vals[0] = memo
		} else {
			buf = appendPolicyList(buf, d, layers, pk)
		}
		policyEnd = len(buf)
		buf = appendLimitList(buf, d, layers, 0, pk)
		limitEnd = len(buf)
	}
	buf = strconv.AppendInt(buf, max(1, ceilDiv(d.RetryAfter, time.Second)), 10)
	retryEnd := len(buf)
	fast := h.defaultDenied
	if fast {
		buf, fast = appendDenial(buf, d)
	}
	hdr := w.Header()
	if fields {
		if vals[0] == "" {
			vals[0] = unsafe.String(&buf[0], policyEnd)
		}
		vals[1] = unsafe.String(&buf[policyEnd], limitEnd-policyEnd)
		hdr["Ratelimit-Policy"] = vals[0:1:1]
		hdr["Ratelimit"] = vals[1:2:2]
		if h.legacy {
			setLegacy(hdr, d, 0)
		}
	}
	vals[2] = unsafe.String(&buf[limitEnd], retryEnd-limitEnd)
	vals[3] = "no-store"
	hdr["Retry-After"] = vals[2:3:3]
	hdr["Cache-Control"] = vals[3:4:4]
	if !fast {
		h.denied(w, r, d)
		return
	}
	vals[4], vals[5] = "application/json", "nosniff"
	hdr["Content-Type"] = vals[4:5:5]
	hdr["X-Content-Type-Options"] = vals[5:6:6]
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(buf[retryEnd:])
}

// appendDenial appends the default 429 body for d, the bytes deny writes,
// and reports whether it could: the policy's name must be printable ASCII
// that neither JSON (which escapes '<', '>' and '&' too) nor a Go quoted
// string escapes, and the wait in milliseconds must fit a Duration.
func appendDenial(buf []byte, d ratelimit.Decision) ([]byte, bool) {
	name := policyName(d)
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return buf, false
		}
	}
	ms := ceilDiv(d.RetryAfter, time.Millisecond)
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return buf, false
	}
	buf = append(buf, `{"error":"rate_limited","policy":"`...)
	buf = append(buf, name...)
	buf = append(buf, `","retry_after_ms":`...)
	buf = strconv.AppendInt(buf, ms, 10)
	buf = append(buf, `,"message":"too many requests for policy \"`...)
	buf = append(buf, name...)
	buf = append(buf, `\": retry in `...)
	buf = appendMillis(buf, ms)
	return append(buf, "\"}\n"...), true
}

// appendMillis appends ms milliseconds as [time.Duration.String] writes
// them: "0s", "250ms", "1.5s", "2m0.001s", "1h0m0s".
func appendMillis(buf []byte, ms int64) []byte {
	switch {
	case ms == 0:
		return append(buf, "0s"...)
	case ms < 1000:
		return append(strconv.AppendInt(buf, ms, 10), "ms"...)
	}
	s, frac := ms/1000, ms%1000
	if h := s / 3600; h > 0 {
		buf = append(strconv.AppendInt(buf, h, 10), 'h')
	}
	if s >= 60 {
		buf = append(strconv.AppendInt(buf, s/60%60, 10), 'm')
	}
	buf = strconv.AppendInt(buf, s%60, 10)
	if frac != 0 {
		digits := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
		n := 3
		for digits[n-1] == '0' {
			n--
		}
		buf = append(append(buf, '.'), digits[:n]...)
	}
	return append(buf, 's')
}
