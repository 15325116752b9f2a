package ratelimit

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseStateEdges: parseState reads every canonical decimal up to
// math.MaxInt64 and refuses anything beyond it, at any length.
func TestParseStateEdges(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int64
	}{
		{"0", []int64{0}},
		{"9", []int64{9}},
		{"922337203685477580", []int64{922337203685477580}},
		{"9223372036854775799", []int64{9223372036854775799}},
		{"9223372036854775800", []int64{9223372036854775800}},
		{"9223372036854775806", []int64{math.MaxInt64 - 1}},
		{"9223372036854775807", []int64{math.MaxInt64}},
		{"1 9223372036854775807 0", []int64{1, math.MaxInt64, 0}},
		{"9223372036854775807 9223372036854775807", []int64{math.MaxInt64, math.MaxInt64}},
		{"9223372036854775808", nil},  // MaxInt64 + 1
		{"9223372036854775809", nil},  // + 2
		{"9223372036854775810", nil},  // the last digit wraps
		{"9223372036854775817", nil},  // + 10
		{"9300000000000000000", nil},  // 19 digits, above it
		{"18446744073709551615", nil}, // MaxUint64
		{"18446744073709551616", nil}, // wraps uint64 too
		{"92233720368547758070", nil}, // MaxInt64 with a digit more
		{"99999999999999999999999999999", nil},
		{"1 9223372036854775808 0", nil},
		{"09223372036854775807", nil}, // a leading zero
		{"00", nil},
		{"01", nil},
		{"1 01 0", nil},
		{"1 00", nil},
	} {
		got, err := parseState([]byte(c.in))
		if c.want == nil {
			require.ErrorIs(t, err, ErrInvalidState, "%q", c.in)
			assert.Nil(t, got, "%q", c.in)
			continue
		}
		require.NoError(t, err, "%q", c.in)
		assert.Equal(t, c.want, got, "%q", c.in)
	}
}
