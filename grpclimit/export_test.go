package grpclimit

// WithRandom sets the random source of the jitter added to a shed call's
// retry delay: randN(n) returns an int64 in [0, n), as rand.Int64N does.
func WithRandom(randN func(n int64) int64) ClientOption {
	return func(c *clientConfig) { c.randN = randN }
}
