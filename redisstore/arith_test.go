package redisstore

import (
	"context"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// arithHarness runs the script's arithmetic on batches of operands: ARGV is
// op, x, y triples; the reply has one result per op (two for divmod).
const arithHarness = `
local out = {}
for i = 1, #ARGV, 3 do
  local op, x, y = ARGV[i], parse(ARGV[i + 1], 40), parse(ARGV[i + 2], 40)
  if op == 'add' then out[#out + 1] = S(add(x, y))
  elseif op == 'sub' then out[#out + 1] = S(sub(x, y))
  elseif op == 'mul' then out[#out + 1] = S(mul(x, y))
  elseif op == 'muls' then out[#out + 1] = S(muls(x, tonumber(ARGV[i + 2])))
  elseif op == 'cmp' then out[#out + 1] = tostring(cmp(x, y))
  elseif op == 'divmod' then
    local q, r = divmod(x, y)
    out[#out + 1] = S(q)
    out[#out + 1] = S(r)
  elseif op == 'divtime' then
    local th, tl = lpair(x)
    local dh, dl = lpair(y)
    local qh, ql, rh, rl = pdivtime(th, tl, dh, dl)
    out[#out + 1] = pstr(qh, ql)
    out[#out + 1] = pstr(rh, rl)
  elseif op == 'time' then out[#out + 1] = S(fromtime(ARGV[i + 1], ARGV[i + 2]))
  elseif op == 'ptime' then out[#out + 1] = pstr(pnow({ARGV[i + 1], ARGV[i + 2]}))
  elseif op == 'ceilms' then out[#out + 1] = string.format('%d', ceilms(x))
  elseif op == 'pms' then out[#out + 1] = string.format('%d', pms(lpair(x)))
  elseif op == 'N' then
    local v = N(ARGV[i + 1])
    out[#out + 1] = v and S(v) or 'nil'
  end
end
return out
`

// arithScript runs the harness on the limbs (arith.lua), beside the pairs
// (pairs.lua) that the windows' step moves between them and limbs.
var arithScript = redis.NewScript(expandLua(pairsLua + "\n" + arithLua + "\n" + arithHarness))

type arithCase struct {
	op   string
	x, y *big.Int
}

// want is the math/big result of c, as the harness prints it.
func (c arithCase) want() []string {
	z := new(big.Int)
	switch c.op {
	case "add":
		return []string{z.Add(c.x, c.y).String()}
	case "sub":
		return []string{z.Sub(c.x, c.y).String()}
	case "mul", "muls":
		return []string{z.Mul(c.x, c.y).String()}
	case "cmp":
		return []string{big.NewInt(int64(c.x.Cmp(c.y))).String()}
	case "divmod", "divtime":
		q, r := new(big.Int).QuoRem(c.x, c.y, new(big.Int))
		return []string{q.String(), r.String()}
	}
	panic(c.op)
}

func runArith(t *testing.T, rdb *redis.Client, cases []arithCase) {
	t.Helper()
	for len(cases) > 0 {
		batch := cases[:min(len(cases), 500)]
		cases = cases[len(batch):]
		args := make([]any, 0, 3*len(batch))
		var want []string
		for _, c := range batch {
			args = append(args, c.op, c.x.String(), c.y.String())
			want = append(want, c.want()...)
		}
		got, err := arithScript.Run(context.Background(), rdb, nil, args...).StringSlice()
		require.NoError(t, err)
		require.Len(t, got, len(want))
		j := 0
		for _, c := range batch {
			for _, w := range c.want() {
				if !assert.Equal(t, w, got[j], "%s(%s, %s)", c.op, c.x, c.y) {
					return
				}
				j++
			}
		}
	}
}

// boundaries are values near the edges that matter: limbs of 10^7, 2^53,
// 2^62 (MaxTime), 2^63, 10^18 (the largest capacity in milli-units).
func boundaries() []*big.Int {
	var out []*big.Int
	add := func(v *big.Int) {
		for d := int64(-2); d <= 2; d++ {
			if w := new(big.Int).Add(v, big.NewInt(d)); w.Sign() >= 0 {
				out = append(out, w)
			}
		}
	}
	for _, e := range []uint{0, 1, 7, 14, 21, 26, 31, 32, 52, 53, 54, 62, 63, 64} {
		add(new(big.Int).Lsh(big.NewInt(1), e))
	}
	for e := int64(1); e <= 19; e++ {
		add(new(big.Int).Exp(big.NewInt(10), big.NewInt(e), nil))
	}
	return out
}

// randBig returns a value of 1 to digits decimal digits, often with runs of
// 9s or 0s, which stress carries and borrows.
func randBig(r *rand.Rand, digits int) *big.Int {
	n := 1 + r.IntN(digits)
	var sb strings.Builder
	style := r.IntN(4)
	for i := range n {
		switch {
		case style == 1 && i > 0:
			sb.WriteByte('9')
		case style == 2 && i > 0:
			sb.WriteByte('0')
		default:
			sb.WriteByte(byte('0' + r.IntN(10)))
		}
	}
	v, _ := new(big.Int).SetString(sb.String(), 10)
	return v
}

func TestArithmeticAgainstBig(t *testing.T) {
	rdb := needRedis(t)
	r := rand.New(rand.NewPCG(1, 2))
	var cases []arithCase
	push := func(x, y *big.Int) {
		cases = append(cases, arithCase{"add", x, y}, arithCase{"mul", x, y}, arithCase{"cmp", x, y})
		if x.Cmp(y) >= 0 {
			cases = append(cases, arithCase{"sub", x, y})
		} else {
			cases = append(cases, arithCase{"sub", y, x})
		}
		if y.Sign() > 0 {
			cases = append(cases, arithCase{"divmod", x, y})
		}
		if y.Sign() > 0 && y.Cmp(big.NewInt(10_000_000)) < 0 {
			cases = append(cases, arithCase{"muls", x, y})
		}
	}
	bs := boundaries()
	for _, x := range bs {
		for _, y := range bs {
			push(x, y)
		}
	}
	for range 20000 {
		push(randBig(r, 19), randBig(r, 19))
	}
	// Products as wide as the sliding counter's comparison, divided back.
	for range 5000 {
		x := new(big.Int).Mul(randBig(r, 19), randBig(r, 19))
		push(x, randBig(r, 19))
		push(x, randBig(r, 38))
	}
	runArith(t, rdb, cases)
}

// TestWindowOfAnInstant: pdivtime, the window of an instant (in doubles
// for spans of whole microseconds or dividing a second, below 2^51, else
// in limbs), is the quotient and remainder for instants up to MaxTime, on
// either side of each bound, for spans up to 10^19.
func TestWindowOfAnInstant(t *testing.T) {
	rdb := needRedis(t)
	r := rand.New(rand.NewPCG(3, 4))
	maxTime := new(big.Int).Lsh(big.NewInt(1), 62)
	var instants []*big.Int
	for _, v := range boundaries() {
		if v.Cmp(maxTime) <= 0 {
			instants = append(instants, v)
		}
	}
	for range 300 {
		instants = append(instants, new(big.Int).Rsh(new(big.Int).SetUint64(r.Uint64()), 1+uint(r.IntN(40))), randBig(r, 18))
	}
	spans := []*big.Int{big.NewInt(1_500), big.NewInt(1_000_000_001), big.NewInt(3), big.NewInt(7)}
	for _, d := range []int64{1, 2, 4, 5, 8, 10, 16, 125, 1_000, 1_024, 3_000, 62_500, 1_000_000, 999_000, 1_000_000_000,
		2_000_000_000, 60_000_000_000, 86_400_000_000_000} {
		spans = append(spans, big.NewInt(d))
	}
	for _, e := range []uint{50, 51, 52, 53, 62} {
		p := new(big.Int).Lsh(big.NewInt(1), e)
		for _, d := range []int64{-1000, -1, 0, 1000} {
			spans = append(spans, new(big.Int).Add(p, big.NewInt(d)))
		}
	}
	for range 100 {
		spans = append(spans, new(big.Int).Mul(new(big.Int).Add(randBig(r, 12), big.NewInt(1)), big.NewInt(1000)), new(big.Int).Add(randBig(r, 19), big.NewInt(1)))
	}
	var cases []arithCase
	for _, x := range instants {
		for _, y := range spans {
			cases = append(cases, arithCase{"divtime", x, y})
		}
	}
	runArith(t, rdb, cases)
}

// TestTimeAndMilliseconds: TIME's reply in ns, and spans in ms rounded up,
// in limbs (settle.lua's) and in pairs (the check's).
func TestTimeAndMilliseconds(t *testing.T) {
	rdb := needRedis(t)
	r := rand.New(rand.NewPCG(5, 6))
	var args []any
	var want []string
	for i := range 20000 {
		sec, usec := r.Int64N(4_611_686_018), r.Int64N(1_000_000)
		if i < 4 {
			sec, usec = []int64{0, 0, 1_780_000_000, 4_611_686_017}[i], []int64{0, 999_999, 9_999, 10_000}[i]
		}
		ns0 := new(big.Int).Add(new(big.Int).Mul(big.NewInt(sec), big.NewInt(1e9)), big.NewInt(usec*1000)).String()
		args = append(args, "time", strconv.FormatInt(sec, 10), strconv.FormatInt(usec, 10))
		args = append(args, "ptime", strconv.FormatInt(sec, 10), strconv.FormatInt(usec, 10))
		want = append(want, ns0, ns0)
		ns := r.Int64N(1 << 62)
		if i < 4 {
			ns = []int64{0, 1, 1_000_000, 1_000_001}[i]
		}
		args = append(args, "ceilms", strconv.FormatInt(ns, 10), "0", "pms", strconv.FormatInt(ns, 10), "0")
		ms := strconv.FormatInt((ns+999_999)/1_000_000, 10)
		want = append(want, ms, ms)
	}
	for len(args) > 0 {
		n := min(len(args), 3000)
		got, err := arithScript.Run(context.Background(), rdb, nil, args[:n]...).StringSlice()
		require.NoError(t, err)
		require.Equal(t, want[:n/3], got)
		args, want = args[n:], want[n/3:]
	}
}

func TestParseRejectsNonCanonical(t *testing.T) {
	rdb := needRedis(t)
	tests := []struct{ in, want string }{
		{"0", "0"},
		{"7", "7"},
		{"9223372036854775807", "9223372036854775807"},
		{"9223372036854775808", "nil"},
		{"10000000000000000000", "nil"},
		{"", "nil"},
		{"01", "nil"},
		{"-1", "nil"},
		{"1e3", "nil"},
		{" 1", "nil"},
		{"1.5", "nil"},
		{"0x10", "nil"},
	}
	for _, tc := range tests {
		got, err := arithScript.Run(context.Background(), rdb, nil, "N", tc.in, "0").StringSlice()
		require.NoError(t, err)
		assert.Equal(t, []string{tc.want}, got, "N(%q)", tc.in)
	}
}
