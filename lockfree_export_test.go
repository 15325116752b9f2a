package ratelimit

// SingleKeyPath reports how a single-key limiter built by New keeps its
// state: "lock-free" (one word moved by compare-and-swap), "moved" (a
// lock-free limiter whose state has moved under its mutex) or "mutex".
func SingleKeyPath(lim Limiter) string {
	l, ok := lim.(*atomicGCRA)
	switch {
	case !ok || l.mutexOnly:
		return "mutex"
	case l.word.Load() == movedWord:
		return "moved"
	}
	return "lock-free"
}
