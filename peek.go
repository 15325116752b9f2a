package ratelimit

import (
	"context"
	"errors"
	"fmt"
)

// Peek returns the Decision that lim would give a request of cost now,
// spending nothing: the same Decision, field for field, as lim.Check(cost)
// at the same instant, without changing lim. Its errors are Check's. A
// rule that counts refusals ([SlidingCounter] and [SubWindow] with
// CountRefused) reports a refusal as Check would, and counts nothing.
//
// lim must be a limiter built by [New]; any other is an error matching
// [errors.ErrUnsupported].
func Peek(lim Limiter, cost Units) (Decision, error) {
	p, ok := lim.(peeker)
	if !ok {
		return Decision{}, unsupported("Peek", lim)
	}
	return p.peek(cost)
}

// peeker is what the single-key limiters of this package offer for Peek.
type peeker interface {
	peek(cost Units) (Decision, error)
}

// unsupported is the error for a limiter that is not one of this
// package's.
func unsupported(op string, lim any) error {
	return fmt.Errorf("ratelimit: %s: %T is not a limiter built by New: %w", op, lim, errors.ErrUnsupported)
}

func (l *single[S, A]) peek(cost Units) (Decision, error) {
	if d, err := checkCost(cost, l.capMil, l.pol); err != nil {
		return d, err
	}
	now := clampTime(l.clock.Now())
	l.tl.mu.Lock()
	// Judged at the instant a Check would use, which a look does not
	// record: a clock that went back stays clamped exactly as before.
	d := l.alg.step(&l.state, max(now, l.tl.last), int64(cost), stepPeek)
	l.tl.unlock()
	return d, nil
}

// look reads the clock as l.now() does, without recording the reading.
func (l *atomicGCRA) look() int64 {
	if l.mono == nil {
		return clampTime(systemClock{}.Now())
	}
	return max(clampTime(l.mono.clock.Now()), l.mono.last.Load())
}

func (l *atomicGCRA) peek(cost Units) (Decision, error) {
	if d, err := checkCost(cost, l.alg.capMilli, &l.alg.pol); err != nil {
		return d, err
	}
	// The instant a Check would decide at (see atomicGCRA), without
	// recording the reading.
	s, at := l.load(l.look(), l.look)
	var d Decision
	l.decide(&d, &s, at, int64(cost))
	return d, nil
}

// Peek returns the Decision that [Store.Check] would give cost for key now,
// spending nothing: the same Decision, field for field, as Check at the
// same instant, with the store left as it was. A key the store does not
// hold is judged as a fresh key and is not added. Its errors are Check's.
func (s *Store) Peek(key string, cost Units) (Decision, error) {
	if d, err := checkCost(cost, s.core.capacity(), s.core.policy()); err != nil {
		return d, err
	}
	layers := [1]compositeLayer{{store: s.core, counts: true}}
	return peekLayers(layers[:], 1, s.core.clock(), key, int64(cost)), nil
}

// Peek returns the Decision that [Composite.Check] would give cost for key
// now, spending nothing in any layer: the same Decision, field for field,
// as Check at the same instant (Shadowed included), with every layer left
// as it was. No shadow layer's OnShadow is called. A layer key that a
// layer's store does not hold is judged as a fresh key and is not added.
// Its errors are Check's.
func (c *Composite) Peek(key string, cost Units) (Decision, error) {
	if d, err := c.checkCost(cost); err != nil {
		return d, err
	}
	return peekLayers(c.layers, c.enforced, c.clock, key, int64(cost)), nil
}

// Peek returns the Decision that [Plans.Check] would give cost for key now,
// spending nothing, as [Composite.Peek] does over the key's plan. One thing
// it may change: a key whose plan has changed since it was last checked
// (see [Plans]) is moved to its new plan's stores first, converted as its
// next check would convert it; that moves what the key has spent and
// spends nothing. A key no store of the rule set holds is judged as a
// fresh key and is not added. Its errors are Check's.
func (p *Plans) Peek(key string, cost Units) (Decision, error) {
	a, err := p.try(context.Background(), key, cost, peekOnly)
	return a.d, err
}

// peekOnly, as the budget of a Plans attempt, makes it a look that spends
// nothing (see tryIn).
const peekOnly = -1

// peekLayers is tryLayers for a look that spends nothing: the Decision
// tryLayers would give, with nothing acquired, committed or reported.
func peekLayers(layers []compositeLayer, enforced int, clock Clock, key string, cost int64) Decision {
	var buf [inlineLayers]layerTurn
	turns := prepareTurns(layers, key, cost, buf[:0])
	// Lock as tryLayers does, and agree on the instant it would, without
	// recording it in any shard.
	now := clampTime(clock.Now())
	for i := range turns {
		if turns[i].err == nil {
			now = max(now, layers[i].store.peekShard(turns[i].shard, now))
		}
	}
	d := peekLocked(layers, turns, enforced, now, cost)
	for i := len(turns) - 1; i >= 0; i-- {
		if turns[i].err == nil {
			layers[i].store.unlockShard(turns[i].shard) // a look evicts nothing
		}
	}
	return d
}

// peekLocked is decideLocked for a look: with every layer's shard locked
// at now, the Decision an attempt would give cost, with nothing acquired
// or changed, or, for a Store's layer that counts refusals, the Decision
// the Store's Check would give. A key a store does not hold is stepped as
// a fresh one (see keyedStore.stepAt).
func peekLocked(layers []compositeLayer, turns []layerTurn, enforced int, now, cost int64) Decision {
	admitted := true
	for i := range turns {
		t := &turns[i]
		if t.err == nil {
			m := stepLook
			if layers[i].counts {
				m = stepPeek
			}
			t.d = layers[i].store.stepAt(t.k, now, cost, m)
			if !layers[i].shadow && !t.d.Allowed {
				admitted = false
			}
		}
	}
	view := enforced > 0
	d := combine(layers, turns, view)
	if !admitted {
		d.Remaining = remainingNow(layers, turns, now, view)
	}
	// The shadow layers' part, as reportShadows gives it, told to no one.
	shadowDenies := false
	for i := range turns {
		if layers[i].shadow && (turns[i].err != nil || !turns[i].d.Allowed) {
			shadowDenies = true
		}
	}
	if enforced == 0 {
		d = admitShadow(d, !d.Allowed || shadowDenies)
	} else if d.Allowed && shadowDenies {
		d.Shadowed = true
	}
	return d
}

// peekShard locks shard i and returns now clamped to the shard's latest
// time, without recording it: the instant a check would use, for a look.
func (c *storeCore[S, A]) peekShard(i int, now int64) int64 {
	sh := &c.shards[i]
	sh.wait()
	return max(now, sh.tl.last)
}

// lookAll is lockAll for a look: it locks every shard in the same order
// and returns the instant lockAll would agree on, recording it nowhere.
func lookAll(locks []shardLock, now int64) int64 {
	for i := 1; i < len(locks); i++ {
		for j := i; j > 0 && locks[j].store.id() < locks[j-1].store.id(); j-- {
			locks[j], locks[j-1] = locks[j-1], locks[j]
		}
	}
	for _, l := range locks {
		now = max(now, l.store.peekShard(l.shard, now))
	}
	return now
}
