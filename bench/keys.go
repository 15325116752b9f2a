package bench

import (
	"math/rand/v2"
	"strconv"
	"sync"
)

// NumKeys is the number of distinct keys in the keyed benchmarks.
const NumKeys = 1_000_000

var keySet struct {
	once  sync.Once
	keys  []string
	order []int32
}

// Keys returns NumKeys distinct IPv4 addresses as strings (7 to 15 bytes,
// as a limiter keyed by client address sees them), in a fixed
// pseudo-random order, and a fixed random permutation of their indices:
// the order in which the benchmarks check them. Both are made once per
// process, from a fixed seed, before any timing starts.
func Keys() (keys []string, order []int32) {
	keySet.once.Do(func() {
		r := rand.New(rand.NewPCG(2024, 6))
		seen := make(map[uint32]struct{}, NumKeys)
		keys := make([]string, 0, NumKeys)
		for len(keys) < NumKeys {
			ip := r.Uint32()
			if _, dup := seen[ip]; dup {
				continue
			}
			seen[ip] = struct{}{}
			b := make([]byte, 0, 15)
			for i := 3; i >= 0; i-- {
				b = strconv.AppendUint(b, uint64(ip>>(8*i)&255), 10)
				if i > 0 {
					b = append(b, '.')
				}
			}
			keys = append(keys, string(b))
		}
		order := make([]int32, NumKeys)
		for i := range order {
			order[i] = int32(i)
		}
		r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		keySet.keys, keySet.order = keys, order
	})
	return keySet.keys, keySet.order
}
