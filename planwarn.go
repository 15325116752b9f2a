package ratelimit

import (
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
)

// unknownPlanKeys is how many distinct keys a plan function must leave on
// no plan of the set, while naming none, before Plans warns.
const unknownPlanKeys = 256

// planWarning watches a plan function until it names a plan of the set or
// has named none for unknownPlanKeys distinct keys, and then warns once.
//
// The case it is for: keys reach the plan function in another form than
// the one it looks customers up by (an HTTP middleware keying by a hash of
// the API key, a plan function looking up the raw key), so that every
// paying customer is silently on the default plan. One plan named for one
// key ends the watch: the function works. Until then each check whose
// plan function names no plan takes a lock and notes its key's hash; once
// the watch is over a check reads one atomic flag.
type planWarning struct {
	over   atomic.Bool
	mu     sync.Mutex
	seed   maphash.Seed
	seen   map[uint64]struct{} // hashes of the keys left on no plan
	last   string              // the name the function last returned
	logger *slog.Logger
	quiet  bool
}

func newPlanWarning(o *options) *planWarning {
	w := &planWarning{seed: maphash.MakeSeed(), logger: o.logger, quiet: o.quiet}
	if w.quiet {
		w.over.Store(true)
	}
	return w
}

// named notes that the plan function named a plan of the set.
func (w *planWarning) named() {
	if !w.over.Load() {
		w.over.Store(true)
	}
}

// unnamed notes that the plan function named no plan of the set for key
// (it returned name), and warns once enough distinct keys have had that.
func (w *planWarning) unnamed(key, name, def string) {
	if w.over.Load() {
		return
	}
	h := maphash.String(w.seed, key)
	w.mu.Lock()
	if w.over.Load() {
		w.mu.Unlock()
		return
	}
	if w.seen == nil {
		w.seen = make(map[uint64]struct{}, unknownPlanKeys)
	}
	w.seen[h] = struct{}{}
	w.last = name
	if len(w.seen) < unknownPlanKeys {
		w.mu.Unlock()
		return
	}
	w.over.Store(true)
	w.seen = nil
	last := w.last
	w.mu.Unlock()
	l := w.logger
	if l == nil {
		l = slog.Default()
	}
	l.Warn("ratelimit: the plan function named no plan of the set for any of the keys checked so far; every key is on the default plan. If keys reach it hashed (httplimit.HeaderKey hashes them), look customers up by the same function (httplimit.SecretKey) or pass the plan with httplimit.WithPlan",
		"distinct_keys", unknownPlanKeys, "last_name_returned", clipName(last, 64), "default_plan", def)
}

// clipName shortens s to at most n bytes for a log line.
func clipName(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
