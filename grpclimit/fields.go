package grpclimit

import (
	"math/bits"
	"strconv"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/ratekit/ratelimit"
)

// Names of the metadata fields set on every checked call (see the package
// documentation).
const (
	PolicyField = "ratelimit-policy"
	LimitField  = "ratelimit"
)

// defaultPolicy names the policy of a rule without a Name, as httplimit does.
const defaultPolicy = "default"

// maxSFInt is the largest Integer a structured field (RFC 9651) may carry.
const maxSFInt = 999_999_999_999_999

func policyName(d ratelimit.Decision) string {
	if d.Policy == "" {
		return defaultPolicy
	}
	return d.Policy
}

// fields returns the ratelimit-policy and ratelimit metadata for d, as
// seen elapsed after the decision was made (an admitted call's Delay, which
// it has waited out).
func fields(d ratelimit.Decision, elapsed time.Duration) metadata.MD {
	return metadata.MD{
		PolicyField: {policyValue(d)},
		LimitField:  {limitValue(d, elapsed)},
	}
}

// limitValue is the ratelimit field: "<name>";r=<Remaining>;t=<seconds
// until the allowance is whole, rounded up>, elapsed after the decision.
func limitValue(d ratelimit.Decision, elapsed time.Duration) string {
	buf := make([]byte, 0, len(d.Policy)+40)
	buf = appendSFString(buf, policyName(d))
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, min(max(0, d.Remaining), maxSFInt), 10)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, ceilDiv(d.ResetAfter-elapsed, time.Second), 10)
	return string(buf)
}

// policyValue is the ratelimit-policy field: "<name>";q=<quota>;w=<window>,
// w being the Window in whole seconds rounded up (at least 1) and q the
// quota the rule grants over w, Limit x w / Window rounded to the nearest
// integer, so that q/w is the rule's rate.
func policyValue(d ratelimit.Decision) string {
	w := max(1, ceilDiv(d.Window, time.Second))
	q := max(0, d.Limit)
	if d.Window > 0 && d.Window != time.Duration(w)*time.Second {
		q = quota(uint64(q), uint64(w)*uint64(time.Second), uint64(d.Window))
	}
	buf := make([]byte, 0, len(d.Policy)+40)
	buf = appendSFString(buf, policyName(d))
	buf = append(buf, ";q="...)
	buf = strconv.AppendInt(buf, min(q, maxSFInt), 10)
	buf = append(buf, ";w="...)
	buf = strconv.AppendInt(buf, w, 10)
	return string(buf)
}

// quota returns limit x span / window rounded to the nearest integer,
// saturated at maxSFInt, in 128-bit arithmetic.
func quota(limit, span, window uint64) int64 {
	hi, lo := bits.Mul64(limit, span)
	if hi >= window {
		return maxSFInt
	}
	n, r := bits.Div64(hi, lo, window)
	if r >= window-r {
		n++
	}
	return int64(min(n, maxSFInt))
}

// appendSFString appends s as a structured-field String: quoted, with '"'
// and '\' escaped, and bytes outside printable ASCII replaced by '?'.
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

// ceilDiv returns d/unit rounded up, and 0 for d <= 0.
func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d-1)/unit + 1)
}
