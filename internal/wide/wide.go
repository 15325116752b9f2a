// Package wide holds the 128-bit arithmetic behind the limiters' exact
// rationals. Every function reports overflow instead of wrapping or
// panicking, so callers can prove their bounds once (at rule validation) and
// rely on them on the hot path.
package wide

import "math/bits"

// MulDiv returns floor(a*b/c) and (a*b) mod c, computing a*b in 128 bits.
// ok is false, and q and r are zero, when c is 0 or the quotient does not fit
// in 64 bits.
func MulDiv(a, b, c uint64) (q, r uint64, ok bool) {
	hi, lo := bits.Mul64(a, b)
	if c == 0 || hi >= c {
		return 0, 0, false
	}
	q, r = bits.Div64(hi, lo, c)
	return q, r, true
}

// MulAddDiv returns floor((a*b+d)/c) and (a*b+d) mod c, computing in 128
// bits. ok is false when c is 0 or the quotient does not fit in 64 bits.
func MulAddDiv(a, b, d, c uint64) (q, r uint64, ok bool) {
	hi, lo := bits.Mul64(a, b)
	var carry uint64
	lo, carry = bits.Add64(lo, d, 0)
	hi += carry // cannot wrap: a*b <= (2^64-1)^2 leaves room for one more 2^64
	if c == 0 || hi >= c {
		return 0, 0, false
	}
	q, r = bits.Div64(hi, lo, c)
	return q, r, true
}

// MulCmp compares a*b with c*d exactly, returning -1, 0 or +1.
func MulCmp(a, b, c, d uint64) int {
	h1, l1 := bits.Mul64(a, b)
	h2, l2 := bits.Mul64(c, d)
	switch {
	case h1 < h2, h1 == h2 && l1 < l2:
		return -1
	case h1 == h2 && l1 == l2:
		return 0
	}
	return 1
}

// GCD returns the greatest common divisor of a and b (GCD(0, b) == b).
func GCD(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
