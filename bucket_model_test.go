package ratelimit_test

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/internal/refmodel"
)

func drawBucketCase(t *rapid.T, kind string) modelCase {
	r, c, name := drawRate(t), drawCapacity(t), drawName(t)
	mc := modelCase{scale: r.Per, valid: spanFits(r, c), name: name}
	if mc.valid {
		mc.window = bucketWindow(r, c)
	}
	switch kind {
	case "TokenBucket":
		mc.rule, mc.model = ratelimit.TokenBucket{Rate: r, Burst: c, Name: name}, refmodel.NewBucket(r, c)
	case "GCRA":
		mc.rule, mc.model = ratelimit.GCRA{Rate: r, Burst: c, Name: name}, refmodel.NewBucket(r, c)
	case "LeakyBucket":
		mc.rule, mc.model = ratelimit.LeakyBucket{Rate: r, Capacity: c, Name: name}, refmodel.NewQueue(r, c)
	}
	return mc
}

func TestTokenBucketModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { runModel(t, drawBucketCase(t, "TokenBucket")) })
}

func TestGCRAModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { runModel(t, drawBucketCase(t, "GCRA")) })
}

func TestLeakyBucketModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) { runModel(t, drawBucketCase(t, "LeakyBucket")) })
}
