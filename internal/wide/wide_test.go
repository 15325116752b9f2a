package wide

import (
	"math"
	"math/big"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestDividerMatchesDivision(t *testing.T) {
	edge := []uint64{1, 2, 3, 5, 7, 10, 641, 1000, 1e5, 1e9, 6700417, 1<<32 - 1, 1 << 32, 1<<63 - 1, 1 << 63, 1<<63 + 1, math.MaxUint64 - 1, math.MaxUint64}
	rapid.Check(t, func(t *rapid.T) {
		d := rapid.OneOf(rapid.SampledFrom(edge), rapid.Uint64Range(1, math.MaxUint64), rapid.Uint64Range(1, 1<<20)).Draw(t, "d")
		x := rapid.OneOf(rapid.SampledFrom(edge), rapid.Uint64(), rapid.Uint64Range(0, 1<<20)).Draw(t, "x")
		v, ok := NewDivider(d)
		require.True(t, ok)
		q, r := v.DivMod(x)
		require.Equal(t, x/d, q, "%d / %d", x, d)
		require.Equal(t, x%d, r, "%d %% %d", x, d)
		// Near multiples of d are where a reciprocal goes wrong first.
		for _, k := range []uint64{x / d, x/d + 1} {
			hi, lo := k*d, k*d-1
			if k != 0 && hi/d == k {
				require.Equal(t, hi/d, v.Div(hi), "%d / %d", hi, d)
				require.Equal(t, lo/d, v.Div(lo), "%d / %d", lo, d)
			}
		}
	})
	_, ok := NewDivider(0)
	require.False(t, ok)
}

func TestMulDivAgainstBig(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, b, d := rapid.Uint64().Draw(t, "a"), rapid.Uint64().Draw(t, "b"), rapid.Uint64().Draw(t, "d")
		c := rapid.OneOf(rapid.Uint64(), rapid.Uint64Range(0, 1000)).Draw(t, "c")
		prod := new(big.Int).Mul(new(big.Int).SetUint64(a), new(big.Int).SetUint64(b))
		sum := new(big.Int).Add(prod, new(big.Int).SetUint64(d))
		check := func(n *big.Int, q, r uint64, ok bool) {
			if c == 0 {
				require.False(t, ok)
				return
			}
			wq, wr := new(big.Int).QuoRem(n, new(big.Int).SetUint64(c), new(big.Int))
			if !wq.IsUint64() {
				require.False(t, ok)
				return
			}
			require.True(t, ok)
			require.Equal(t, wq.Uint64(), q)
			require.Equal(t, wr.Uint64(), r)
		}
		q, r, ok := MulDiv(a, b, c)
		check(prod, q, r, ok)
		q, r, ok = MulAddDiv(a, b, d, c)
		check(sum, q, r, ok)
		e, f := rapid.Uint64().Draw(t, "e"), rapid.Uint64().Draw(t, "f")
		require.Equal(t, prod.Cmp(new(big.Int).Mul(new(big.Int).SetUint64(e), new(big.Int).SetUint64(f))), MulCmp(a, b, e, f))
	})
}
