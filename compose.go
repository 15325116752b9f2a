package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Layer is one limit of a [Composite]: a rule, applied to a key of its own
// that the layer derives from the key the composite is asked about.
type Layer struct {
	// Rule is the layer's rule. Its Name is the Policy that Decisions
	// report when this layer is the one that limits.
	Rule Rule

	// Key derives the layer's key from the key given to Check or Wait: for
	// example a constant for a global limit, the API key part of an
	// "apikey route" key for a per-customer limit, or the whole key for a
	// per-customer-and-route limit. A nil Key uses the given key as it is.
	// Key must be safe for concurrent use, and quick: it runs on every
	// request, before any lock is taken.
	Key func(key string) string

	// Shadow runs the layer in shadow mode: it is asked about every request
	// and keeps its state as if it enforced, but never denies one. Its own
	// answer goes to OnShadow, and a request that it alone would have
	// denied is admitted with Decision.Shadowed set.
	Shadow bool

	// OnShadow, if not nil, receives a shadow layer's report on every
	// request, with the layer's own key (see [ShadowFunc]).
	OnShadow ShadowFunc

	// Options configure the layer's store: [WithMaxKeys] and [WithShards].
	// They apply after the options given to [Compose]; the composite's
	// clock is used whatever they say.
	Options []Option
}

// Composite is several limits that every request must pass together: a
// global cap, a per-customer plan, a tighter per-route limit for expensive
// endpoints. It has the same Check as a [Store] (it is a [KeyedLimiter] and
// a [ContextChecker], so the HTTP middleware takes it) and a Wait.
//
// A request is admitted only if every enforced layer admits it, and a
// request that any layer denies spends nothing from any layer, under any
// concurrency and for every algorithm. Nothing is ever spent and then
// given back, so no other request can see a layer briefly spent.
//
// The Decision describes the most constraining enforced layer: for a
// denied request, the denying layer with the longest RetryAfter; for an
// admitted one, the layer with the least Remaining (the first on ties). Its
// Limit, ResetAfter, Policy and Window are that layer's. RetryAfter is
// exactly when the request would pass every layer if nothing else arrived;
// Remaining is the largest cost the composite as a whole would admit now;
// Delay is the longest of the layers' (a leaky bucket's queue). A composite
// whose layers are all in shadow mode reports them this way, made into an
// admission as [Shadow] does. Cost errors are the enforced layers'; a cost
// above a shadow layer's capacity goes to its OnShadow and does not stop
// the request.
//
// All layers decide at one instant: the clock's reading, raised to the
// latest instant any check has decided at in the shards that hold the
// request's layer keys (the clamp a [Store] applies per shard; see its
// Time section).
//
// A Composite is safe for concurrent use and linearizable, starts no
// goroutines and needs no Close. Each layer costs what its store costs per
// key (see [Store]); a Check takes one lock per layer. The zero Composite
// is not usable; build one with [Compose].
type Composite struct {
	layers   []compositeLayer
	clock    Clock
	enforced int      // how many layers enforce
	obs      Observer // nil: none
}

// compositeLayer is a built Layer.
type compositeLayer struct {
	store  keyedStore
	key    func(string) string
	shadow bool
	report ShadowFunc
	// counts is set for a Store's own layer when it stands for the Store's
	// Check, which counts a refusal that the rule counts (CountRefused):
	// a Peek or a Settle through it then reports a refusal as that Check
	// would; so is a plan's one layer, for a plan of one rule, whose Check
	// is a Store's. A Composite, a plan of layers, Wait and CheckWithin
	// never count one.
	counts bool
}

// errNoRoom is returned if a store could not hold a key it was asked
// about. A composite pins one key per store and every shard holds at least
// one, so it cannot happen; the error exists so that a broken invariant is
// an error and not a wrong decision.
var errNoRoom = errors.New("ratelimit: a layer's store has no room for the key")

// Compose builds a [Composite] from layers, in the order they are given.
// opts apply to every layer's store: [WithClock] (one clock for all
// layers), [WithMaxKeys] and [WithShards]; each layer's own Options follow
// them. A malformed rule is an error that matches [ErrInvalidRule], and an
// option out of range one that matches [ErrInvalidOption], each naming the
// layer. At least one layer is needed.
func Compose(layers []Layer, opts ...Option) (*Composite, error) {
	if len(layers) == 0 {
		return nil, &RuleError{Rule: "Composite", Field: "layers", Reason: "is empty"}
	}
	o := buildOptions(opts)
	clock := o.clock
	c := &Composite{layers: make([]compositeLayer, len(layers)), clock: clock, obs: o.obs}
	for i, l := range layers {
		if isNil(l.Rule) {
			return nil, &RuleError{Rule: "Composite", Field: fmt.Sprintf("layers[%d].Rule", i), Reason: "is nil"}
		}
		all := append(append(append([]Option(nil), opts...), l.Options...), WithClock(clock))
		store, err := newKeyedStore(l.Rule, all)
		if err != nil {
			return nil, fmt.Errorf("ratelimit: layer %d: %w", i, err)
		}
		c.layers[i] = compositeLayer{store: store, key: l.Key, shadow: l.Shadow, report: l.OnShadow}
		if !l.Shadow {
			c.enforced++
		}
	}
	return c, nil
}

// Check asks every layer about cost for key at the composite's current
// time, and spends it in every layer if every enforced layer admits it (see
// [Composite] for the Decision). Its errors are those of [Limiter.Check].
func (c *Composite) Check(key string, cost Units) (Decision, error) {
	if d, err := c.checkCost(cost); err != nil {
		return d, err
	}
	a := tryLayers(c.layers, c.enforced, c.clock, key, int64(cost), maxBudget)
	if c.obs != nil {
		observe(c.obs, &a, int64(cost))
	}
	return a.d, a.err
}

// CheckContext is [Composite.Check] for callers that hold a context: it
// returns ctx's error, spending nothing, if ctx has already ended, and
// otherwise decides as Check does. It makes a Composite a [ContextChecker].
func (c *Composite) CheckContext(ctx context.Context, key string, cost Units) (Decision, error) {
	if err := ctx.Err(); err != nil {
		d, _ := c.checkCost(Unit)
		return d, err
	}
	return c.Check(key, cost)
}

// CheckWithin is [Composite.Check] for a request that may wait at most
// maxDelay for its turn, as [Store.CheckWithin] describes. A request refused
// only because it would wait too long is described by the layer whose Delay
// is the longest.
func (c *Composite) CheckWithin(key string, cost Units, maxDelay time.Duration) (Decision, error) {
	if d, err := c.checkCost(cost); err != nil {
		return d, err
	}
	return checkWithin(c.layers, c.enforced, c.clock, key, int64(cost), maxDelay, c.obs)
}

// Clock returns the clock every layer reads, and that Wait sleeps on.
func (c *Composite) Clock() Clock { return c.clock }

// Wait blocks until cost is admitted for key by every layer, as
// [Limiter.Wait] does for one limit: it sleeps on the composite's clock for
// exactly the RetryAfter of each denial (the longest of the layers'), never
// polls, and gives up at once, spending nothing, when ctx ends or when its
// deadline would come before the request could go on. A leaky bucket
// layer's Delay is waited out before Wait returns; if ctx ends during that
// wait, the request has already been admitted and stays spent (the
// Decision returned with the error says Allowed), as a request that has
// joined a queue. Each attempt is reported to the shadow layers.
func (c *Composite) Wait(ctx context.Context, key string, cost Units) (Decision, error) {
	d, err := c.checkCost(cost)
	if err != nil {
		return d, err
	}
	try := func(cost int64, budget time.Duration) attempt {
		return tryLayers(c.layers, c.enforced, c.clock, key, cost, budget)
	}
	return waitFor(ctx, c.clock, int64(cost), d, try, c.obs)
}

// Stats returns each layer's store counters, in layer order.
func (c *Composite) Stats() []StoreStats {
	st := make([]StoreStats, len(c.layers))
	for i, l := range c.layers {
		st[i] = l.store.stats()
	}
	return st
}

// checkCost validates cost against the enforced layers. On success the
// Decision is the one to report if nothing else is known: the first
// enforced layer's policy.
func (c *Composite) checkCost(cost Units) (Decision, error) {
	first := &c.layers[0]
	for i := range c.layers {
		if !c.layers[i].shadow {
			first = &c.layers[i]
			break
		}
	}
	if cost <= 0 {
		return checkCost(cost, first.store.capacity(), first.store.policy())
	}
	for i := range c.layers {
		l := &c.layers[i]
		if !l.shadow && int64(cost) > l.store.capacity() {
			return checkCost(cost, l.store.capacity(), l.store.policy())
		}
	}
	return first.store.policy().decision(), nil
}

// Wait blocks until cost is admitted for key, as [Limiter.Wait] does for a
// single key: it sleeps on the store's clock for exactly the RetryAfter of
// each denial, never polls, and gives up at once, spending nothing, when
// ctx ends or when its deadline would come before the request could go on.
// A leaky bucket's Delay is waited out before Wait returns; if ctx ends
// during that wait, the request stays spent (the Decision returned with the
// error says Allowed), as a request that has joined a queue.
func (s *Store) Wait(ctx context.Context, key string, cost Units) (Decision, error) {
	if d, err := checkCost(cost, s.core.capacity(), s.core.policy()); err != nil {
		return d, err
	}
	layers := []compositeLayer{{store: s.core}}
	clock := s.core.clock()
	try := func(cost int64, budget time.Duration) attempt {
		return tryLayers(layers, 1, clock, key, cost, budget)
	}
	return waitFor(ctx, clock, int64(cost), s.core.policy().decision(), try, s.obs)
}

// inlineLayers is how many layers tryLayers handles without allocating.
const inlineLayers = 8

// layerTurn is one layer's part in one attempt.
type layerTurn struct {
	key   string // the layer's own key
	k     storeKey
	shard int
	d     Decision
	err   error     // a shadow layer's cost error: the layer sits this one out
	ev    evictions // keys the layer's shard dropped during the attempt
}

// tryLayers makes one attempt on every layer at one instant, committing an
// admitted request only if it would go on within budget. enforced is how
// many layers enforce. cost has been checked against every enforced layer.
//
// Why it is safe. Each layer is a store of its own, owned by the composite;
// nothing else can reach it. An attempt prepares every layer's key (hashing
// it, outside any lock), then takes the lock of the one shard that holds
// each layer's key, always in the same order, layer after layer. Since a
// composite's locks are only ever taken by the composite in that order, and
// a layer's key is in exactly one shard of its store, concurrent attempts
// cannot deadlock. With every lock held it reads one instant for all layers
// (the clock, raised to the latest instant any of those shards has used, so
// that no key sees time go back) and asks every layer what it would decide
// then without changing anything (each algorithm's step with commit off,
// which is pure). Only if every enforced layer admits does it run the same
// steps again with commit on, before releasing the locks. No other attempt
// can touch those keys between the look and the commit, so the commit does
// exactly what the look said: a denied request has changed nothing, and an
// admitted one is spent in full in every layer, at one instant, which makes
// the composite linearizable like its layers. A key looked at but not spent
// stays in its store as a fresh entry, which the store drops first when it
// needs room. It is a look-then-commit rather than spend-then-refund, so no
// algorithm needs an inverse.
func tryLayers(layers []compositeLayer, enforced int, clock Clock, key string, cost int64, budget time.Duration) attempt {
	return tryLayersOut(layers, enforced, clock, key, cost, budget, nil)
}

// tryLayersOut is tryLayers that also appends every enforced layer's
// Decision to *out, if out is not nil (see appendLayers).
func tryLayersOut(layers []compositeLayer, enforced int, clock Clock, key string, cost int64, budget time.Duration, out *[]Decision) attempt {
	var buf [inlineLayers]layerTurn
	turns := prepareTurns(layers, key, cost, buf[:0])

	now := lockTurns(layers, turns, clock)
	a := decideLocked(layers, turns, enforced, now, cost, budget)
	if out != nil && a.err == nil {
		*out = appendLayers(layers, turns, now, a.committed, *out)
	}
	unlockTurns(layers, turns)
	if a.err == nil {
		reportShadows(layers, turns, enforced, &a)
	}
	return a
}

// lockTurns locks the shard of every turn that has no error, in layer
// order, and returns the one instant they agree on: the latest of the
// clock and of every shard's own. Every shard locked records that instant,
// not just the running maximum seen when it was locked: its keys are
// stepped at now, so no later operation may step them at an earlier time.
func lockTurns(layers []compositeLayer, turns []layerTurn, clock Clock) int64 {
	now := clampTime(clock.Now())
	for i := range turns {
		if turns[i].err == nil {
			now = max(now, layers[i].store.lockShard(turns[i].shard, now))
		}
	}
	for i := range turns {
		if turns[i].err == nil {
			layers[i].store.raiseShard(turns[i].shard, now)
		}
	}
	return now
}

// unlockTurns unlocks what lockTurns locked, in reverse order, and then,
// with no lock held, reports the evictions that made room for the keys.
func unlockTurns(layers []compositeLayer, turns []layerTurn) {
	for i := len(turns) - 1; i >= 0; i-- {
		if turns[i].err == nil {
			turns[i].ev = layers[i].store.unlockShard(turns[i].shard)
		}
	}
	for i := range turns {
		if e := turns[i].ev; e.n|e.lossy != 0 {
			layers[i].store.evicted(e)
		}
	}
}

// prepareTurns derives and prepares every layer's key for a request of
// cost, outside any lock, appending the turns to buf.
func prepareTurns(layers []compositeLayer, key string, cost int64, buf []layerTurn) []layerTurn {
	turns := buf
	if len(layers) > cap(buf) {
		turns = make([]layerTurn, 0, len(layers))
	}
	for i := range layers {
		l := &layers[i]
		t := layerTurn{key: key}
		if l.key != nil {
			t.key = l.key(key)
		}
		if cost > l.store.capacity() { // only a shadow layer gets here
			t.d, t.err = checkCost(Units(cost), l.store.capacity(), l.store.policy())
		} else {
			t.k = l.store.prepare(t.key)
			t.shard = l.store.shardIndex(t.k)
		}
		turns = append(turns, t)
	}
	return turns
}

// decideLocked is the heart of an attempt, with every layer's shard locked
// at the agreed instant now: it acquires each layer's entry, looks, and
// commits an admitted request that would go on within budget.
func decideLocked(layers []compositeLayer, turns []layerTurn, enforced int, now, cost int64, budget time.Duration) attempt {
	a := attempt{now: now}
	for i := range turns {
		if turns[i].err == nil && !layers[i].store.acquire(turns[i].k, now) {
			a.err = errNoRoom
		}
	}

	// Look.
	admitted := a.err == nil
	for i := range turns {
		t := &turns[i]
		if t.err == nil && a.err == nil {
			t.d = layers[i].store.stepAt(t.k, now, cost, stepLook)
			if !layers[i].shadow && !t.d.Allowed {
				admitted = false
			}
		}
	}
	view := enforced > 0 // whether the Decision shows the enforced layers
	a.d = combine(layers, turns, view)
	switch {
	case a.err != nil:
	case admitted:
		if view {
			a.goOn = a.d.Delay
		} // else only shadow layers, which never hold a request back
		if a.goOn <= budget || !view {
			// Commit: every enforced layer, and every shadow layer that
			// would have admitted the request itself.
			for i := range turns {
				t := &turns[i]
				if t.err == nil && (!layers[i].shadow || t.d.Allowed) {
					t.d = layers[i].store.stepAt(t.k, now, cost, stepCheck)
				}
			}
			a.committed = true
		} else {
			a.tooSlow = tooSlow(layers, turns, now, a.goOn-budget)
		}
	default:
		// Remaining keeps its one definition: the largest cost the
		// composite as a whole would admit now, not just the layer shown.
		a.d.Remaining = remainingNow(layers, turns, now, view)
		// Denied: when would it go on if nothing else arrived? After the
		// longest RetryAfter every layer admits; add the longest Delay
		// the layers would then give it.
		a.goOn = a.d.RetryAfter
		at := min(addTime(now, a.d.RetryAfter), int64(MaxTime))
		var delay time.Duration
		for i := range turns {
			if turns[i].err == nil && (!layers[i].shadow || !view) {
				delay = max(delay, layers[i].store.stepAt(turns[i].k, at, cost, stepLook).Delay)
			}
		}
		a.goOn += delay
	}
	return a
}

// reportShadows reports to every shadow layer, outside the locks, and
// flags a request that only shadow layers would deny.
func reportShadows(layers []compositeLayer, turns []layerTurn, enforced int, a *attempt) {
	shadowDenies := false
	for i := range turns {
		l, t := &layers[i], &turns[i]
		if !l.shadow {
			continue
		}
		if t.err != nil || !t.d.Allowed {
			if !shadowDenies {
				a.shadow = t.d
			}
			shadowDenies = true
		}
		if l.report != nil {
			l.report(ShadowReport{Key: t.key, Decision: t.d, Err: t.err})
		}
	}
	if enforced == 0 {
		a.d = admitShadow(a.d, !a.d.Allowed || shadowDenies)
	} else if a.d.Allowed && shadowDenies {
		a.d.Shadowed = true
	}
}

// remainingNow returns the largest whole cost every layer of the view
// (enforced layers if view is true, else the shadow ones) would admit at
// now, before this request: the least of the layers' Remaining as it
// stands. A layer's denied look spends nothing, so its Remaining is that; a
// layer that admitted this request is asked again about its whole capacity,
// which it either admits (it is fresh: Remaining is its Limit) or denies
// with its Remaining.
func remainingNow(layers []compositeLayer, turns []layerTurn, now int64, view bool) int64 {
	rem := int64(-1)
	for i := range turns {
		l, t := &layers[i], &turns[i]
		if t.err != nil || l.shadow == view {
			continue
		}
		r := t.d.Remaining
		if t.d.Allowed {
			if full := l.store.stepAt(t.k, now, l.store.capacity(), stepLook); full.Allowed {
				r = full.Limit
			} else {
				r = full.Remaining
			}
		}
		if rem < 0 || r < rem {
			rem = r
		}
	}
	return max(rem, 0)
}

// tooSlow describes an admissible request refused because it would wait
// over longer than the caller allows: the enforced layer with the longest
// Delay, as it stands before the request, with the composite's Remaining
// and a RetryAfter of over, after which the queue has drained enough.
func tooSlow(layers []compositeLayer, turns []layerTurn, now int64, over time.Duration) Decision {
	slow := -1
	for i := range turns {
		if turns[i].err == nil && !layers[i].shadow && (slow < 0 || turns[i].d.Delay > turns[slow].d.Delay) {
			slow = i
		}
	}
	l, t := &layers[slow], &turns[slow]
	d := l.store.stepAt(t.k, now, l.store.capacity(), stepLook) // denied: its queue is not empty
	d.Allowed, d.Delay, d.RetryAfter = false, 0, over
	d.Remaining = remainingNow(layers, turns, now, true)
	return d
}

// checkWithin is CheckWithin for a Store or a Composite, for a cost checked
// against every enforced layer.
func checkWithin(layers []compositeLayer, enforced int, clock Clock, key string, cost int64, maxDelay time.Duration, obs Observer) (Decision, error) {
	a := tryLayers(layers, enforced, clock, key, cost, max(maxDelay, 0))
	if a.err == nil && !a.committed && a.d.Allowed {
		a.d = a.tooSlow
	}
	if obs != nil {
		observe(obs, &a, cost)
	}
	return a.d, a.err
}

// combine makes the composite Decision from the layers' looks: from the
// enforced layers if view is true, else from every shadow layer that took
// part.
func combine(layers []compositeLayer, turns []layerTurn, view bool) Decision {
	pick := -1
	allowed := true
	var retry, delay time.Duration
	for i := range turns {
		t := &turns[i]
		if t.err != nil || layers[i].shadow == view {
			continue
		}
		delay = max(delay, t.d.Delay)
		if !t.d.Allowed {
			if allowed || t.d.RetryAfter > retry {
				pick, retry = i, t.d.RetryAfter
			}
			allowed = false
			continue
		}
		if allowed && (pick < 0 || t.d.Remaining < turns[pick].d.Remaining) {
			pick = i
		}
	}
	if pick < 0 {
		// Only shadow layers, each with a cost error: the first one's
		// policy describes the request.
		return turns[0].d
	}
	d := turns[pick].d
	if allowed {
		d.Delay = delay
	}
	return d
}
