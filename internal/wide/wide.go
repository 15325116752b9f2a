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

// Divider divides 64-bit numbers by a fixed divisor with a multiplication
// and a shift instead of a hardware division, which costs tens of cycles on
// the hot path. It is the classic round-up reciprocal method (Granlund and
// Montgomery; Robison), with an extra add step for divisors whose reciprocal
// needs 65 bits. The zero Divider is invalid; use NewDivider.
type Divider struct {
	d     uint64
	magic uint64
	shift uint8
	add   bool // the 65-bit case: the magic's top bit is implicit
	pow2  bool
}

// NewDivider returns a Divider for d. ok is false for d == 0.
func NewDivider(d uint64) (v Divider, ok bool) {
	if d == 0 {
		return Divider{}, false
	}
	l := uint8(63 - bits.LeadingZeros64(d)) // floor(log2(d))
	if d&(d-1) == 0 {
		return Divider{d: d, shift: l, pow2: true}, true
	}
	// m = floor(2^(64+l) / d); 2^l < d, so the quotient fits in 64 bits.
	m, rem := bits.Div64(uint64(1)<<l, 0, d)
	if e := d - rem; e < uint64(1)<<l {
		// 2^(64+l) rounded up to a multiple of d is close enough: the
		// error stays below one for every 64-bit numerator.
		return Divider{d: d, magic: m + 1, shift: l}, true
	}
	// Otherwise use 2^(65+l)/d, a 65-bit magic whose top bit is implied.
	m += m
	twice := rem + rem
	if twice >= d || twice < rem {
		m++
	}
	return Divider{d: d, magic: m + 1, shift: l, add: true}, true
}

// Div returns floor(x / d).
func (v *Divider) Div(x uint64) uint64 {
	if v.pow2 {
		return x >> v.shift
	}
	q, _ := bits.Mul64(v.magic, x)
	if v.add {
		return (((x - q) >> 1) + q) >> v.shift
	}
	return q >> v.shift
}

// DivMod returns floor(x / d) and x mod d.
func (v *Divider) DivMod(x uint64) (q, r uint64) {
	q = v.Div(x)
	return q, x - q*v.d
}
