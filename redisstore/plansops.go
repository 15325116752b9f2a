package redisstore

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ratekit/ratelimit"
)

// mask is plans.lua's mask of rp's keys that take part in a request of
// cost ('1' each, '0' for a shadow layer that sits it out).
func (rp *redisPlan) mask(cost ratelimit.Units) string {
	var b strings.Builder
	for i := range rp.heads {
		if rp.takes(i, cost) {
			b.WriteByte('1')
		} else {
			b.WriteByte('0')
		}
	}
	return b.String()
}

// floor is the latest instant rp's deny cache used for rk without telling
// Redis (see Store.args), 0 if it has none.
func (rp *redisPlan) floor(rk string) int64 {
	if rp.single == nil {
		return 0
	}
	return rp.single.floor(rk)
}

// opFailed answers an operation's error: a call's error that no failure
// policy answers is returned (see Plans.unanswered); Redis failing is
// degrade's; any other error as it is.
func (p *Plans) opFailed(key string, err error, degrade func(cause error) error) error {
	var ce *callError
	if !errors.As(err, &ce) {
		return err
	}
	if err, ok := p.unanswered(key, ce.err); ok {
		return err
	}
	return degrade(ce.err)
}

// Peek is PeekContext with a background context.
func (p *Plans) Peek(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return p.PeekContext(context.Background(), key, cost)
}

// PeekContext returns the Decision that [Plans.CheckContext] would give
// cost for key now, spending nothing, as [ratelimit.Plans.Peek] does: the
// key's plan's [Store.PeekContext] (a plan of one rule) or
// [Composite.PeekContext] (a plan of layers), on the keys of its plan.
// As in process, a key whose record names another plan or rule is moved
// to its plan's keys first, as its next check would move it (two calls);
// the move spends nothing. ctx may name the plan (see
// [ratelimit.ContextWithPlan]). Its errors are CheckContext's; when Redis
// fails the error wraps [ErrUnavailable] and the Decision is the failure
// policy's, spending nothing, as for [Store.PeekContext].
func (p *Plans) PeekContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	g := p.gen.Load()
	rp := p.plan(ctx, g, key)
	d, err := p.peek(ctx, g, rp, key, cost)
	return rp.fill(d), err
}

func (p *Plans) peek(ctx context.Context, g *plansGen, rp *redisPlan, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	if d, err := rp.costError(cost); err != nil {
		return d, err
	}
	keys, line, err := p.planKeys(rp, key, cost)
	if err != nil {
		return rp.refused(), err
	}
	ctx, cancel := p.r.bounded(ctx)
	defer cancel()
	mask := rp.mask(cost)
	reply, _, err := p.run(ctx, g, rp, key, keys, line, planOp{kind: "o", cost: cost, floor: rp.floor(keys[0]), keeps: true,
		args: func(now string) []any { return []any{mask, now, "r"} }})
	if err != nil {
		var d ratelimit.Decision
		err = p.opFailed(key, err, func(cause error) error {
			d, err = degradedPeek(p.r.o.fallback, key, cost, cause, p.failureMode(rp))
			return err
		})
		if errors.Is(err, ErrUnavailable) {
			return d, err
		}
		return rp.refused(), err
	}
	r, err := parseOp(reply, strings.Count(mask, "1"))
	if err != nil || r.states == nil {
		return rp.refused(), errors.Join(err, ErrMismatch)
	}
	now := time.Duration(r.instant)
	var d ratelimit.Decision
	switch {
	case rp.single != nil && rp.counts:
		d, _, err = rp.single.m.Step(r.states[0], now, cost, false)
	case rp.single != nil:
		// A plan of one layer decides as a Composite, which counts no
		// refusal (see looks).
		d, err = rp.single.m.Look(r.states[0], now, cost)
	default:
		states := make([][]byte, len(keys))
		j := 0
		for i := range keys {
			if mask[i] == '1' {
				states[i] = r.states[j]
				j++
			}
		}
		d, _, _, err = rp.comp.lm.Step(states, now, cost, false)
	}
	if err != nil {
		p.r.invalid.Add(1)
		return rp.refused(), err
	}
	return d, nil
}

// Refund is RefundContext with a background context.
func (p *Plans) Refund(key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	return p.RefundContext(context.Background(), key, cost, at)
}

// RefundContext gives back up to cost of what key was admitted at the
// instant at (the admitting Decision's At) on the keys of key's plan, as
// [ratelimit.Plans.Refund] does: [Store.RefundContext]'s refund for a plan
// of one rule, [Composite.RefundContext]'s (the least any enforced layer
// gave back) for a plan of layers, in one script call that also reads the
// key's record. A key whose record names another plan or rule is moved to
// its plan's keys first, as its next check would move it, and refunds
// there (two calls). A key Redis does not hold gives back nothing and is
// not created. ctx may name the plan (see [ratelimit.ContextWithPlan]).
// Its errors and failures are the Store's refund's: a cost of zero or less
// is an error matching [ratelimit.ErrInvalidCost], with no server reached;
// do not retry a failed refund blindly.
func (p *Plans) RefundContext(ctx context.Context, key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	g := p.gen.Load()
	rp := p.plan(ctx, g, key)
	if cost <= 0 {
		_, _, err := rp.machine(0).Refund(nil, 0, 0, cost)
		return 0, err
	}
	// Every layer takes part, as in process (the least cost takes all).
	const all = 1
	keys, line, err := p.planKeys(rp, key, all)
	if err != nil {
		return 0, err
	}
	ctx, cancel := p.r.bounded(ctx)
	defer cancel()
	mask := rp.mask(all)
	reply, _, err := p.run(ctx, g, rp, key, keys, line, planOp{kind: "x", cost: all, floor: rp.floor(keys[0]), keeps: true,
		args: func(now string) []any {
			if rp.single != nil {
				return append([]any{mask}, rp.single.settleArgs(now, "r", min(cost, rp.single.p.Capacity), 0, at)...)
			}
			return append([]any{mask}, rp.comp.settleArgs(now, "r", cost, 0, at, all)...)
		}})
	if err != nil {
		return 0, p.opFailed(key, err, func(cause error) error { return cause })
	}
	if rp.single != nil {
		r, err := rp.single.settleReply(reply)
		if err != nil {
			return 0, err
		}
		return rp.single.refunded(key, keys[0], r, cost, at)
	}
	rs, now, err := rp.comp.settleReplies(key, reply, all)
	if err != nil {
		return 0, err
	}
	return rp.comp.refunded(key, rs, now, cost, at)
}

// Settle is SettleContext with a background context.
func (p *Plans) Settle(key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	return p.SettleContext(context.Background(), key, charged, actual, at)
}

// SettleContext settles a request admitted for key at the instant at,
// charged charged and costing actual, on the keys of key's plan, as
// [ratelimit.Plans.Settle] does: [Store.SettleContext]'s settlement for a
// plan of one rule, [Composite.SettleContext]'s for a plan of layers, in
// one script call that also reads the key's record. A key whose record
// names another plan or rule is moved to its plan's keys first, as its
// next check would move it, and settles there (two calls). ctx may name
// the plan (see [ratelimit.ContextWithPlan]). Its cost errors are the
// plan's, with no server reached; its failures are the Store's
// settlement's (do not retry a failed settlement blindly).
func (p *Plans) SettleContext(ctx context.Context, key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	g := p.gen.Load()
	rp := p.plan(ctx, g, key)
	d, settled, err := p.settle(ctx, g, rp, key, charged, actual, at)
	return rp.fill(d), settled, err
}

func (p *Plans) settle(ctx context.Context, g *plansGen, rp *redisPlan, key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	if d, err := rp.costError(charged); err != nil {
		return d, 0, err
	}
	if actual <= 0 {
		d, err := rp.costError(actual)
		return d, 0, err
	}
	keys, line, err := p.planKeys(rp, key, charged)
	if err != nil {
		return rp.refused(), 0, err
	}
	ctx, cancel := p.r.bounded(ctx)
	defer cancel()
	mask := rp.mask(charged)
	reply, sent, err := p.run(ctx, g, rp, key, keys, line, planOp{kind: "x", cost: charged, floor: rp.floor(keys[0]),
		args: func(now string) []any {
			if rp.single != nil {
				return append([]any{mask}, rp.single.settleArgs(now, "s", charged, actual, at)...)
			}
			return append([]any{mask}, rp.comp.settleArgs(now, "s", charged, actual, at, charged)...)
		}})
	recv := time.Now()
	if err != nil {
		return rp.refused(), 0, p.opFailed(key, err, func(cause error) error { return cause })
	}
	if rp.single == nil {
		rs, now, err := rp.comp.settleReplies(key, reply, charged)
		if err != nil {
			return rp.refused(), 0, err
		}
		return rp.comp.settled(key, rs, now, charged, actual, at)
	}
	r, err := rp.single.settleReply(reply)
	if err != nil {
		return rp.refused(), 0, err
	}
	d, settled, err := rp.single.settled(key, keys[0], r, charged, actual, at, sent, recv)
	if err == nil && !rp.counts {
		// A plan of one layer decides as a Composite, which counts no
		// refusal (see looks).
		after := r.written
		if after == nil {
			after = r.old
		}
		d, err = rp.single.m.Look(after, time.Duration(r.instant), charged)
	}
	return d, settled, err
}

// Reset is ResetContext with a background context.
func (p *Plans) Reset(key string) error {
	return p.ResetContext(context.Background(), key)
}

// ResetContext makes key start again as a fresh key, in one script call,
// as [ratelimit.Plans.Reset] does: it deletes every key of the key's plan,
// those of layers with a Key included (so that a global limit is reset for
// every key, as [Composite.ResetContext] resets it), the key's own keys
// (of layers without a Key) of every plan of the rule set and of the plan
// its record names (the plan it was last checked under), and the record.
// The keys of other plans' layers with a Key are left as they are (other
// keys of those plans share them), unless the record names an earlier
// version of the key's plan that an Update replaced: they are deleted
// with the plan's. Unlike [Store.ResetContext] it keeps no clamp on
// time: as in process, where a reset drops the key's entries, the key is
// then one Redis does not hold. ctx may name the plan (see
// [ratelimit.ContextWithPlan]). When Redis fails the error wraps
// [ErrUnavailable], and the key may or may not have been reset.
func (p *Plans) ResetContext(ctx context.Context, key string) error {
	g := p.gen.Load()
	rp := p.plan(ctx, g, key)
	keys, _, err := p.planKeys(rp, key, 0)
	if err != nil {
		return err
	}
	// The key's own keys of every plan: a move onto a plan whose layer at
	// some place has a Key leaves the key's own state at that place where
	// it was, and a record names one plan. They share the record's slot.
	all := append([]string{p.RecordKey(key)}, keys...)
	for _, name := range slices.Sorted(maps.Keys(g.plans)) { // one order for the script
		op := g.plans[name]
		for i, h := range op.heads {
			if op.keyFns[i] == nil && op != rp {
				k, _ := p.keyName(h, key)
				all = append(all, k)
			}
		}
	}
	ctx, cancel := p.r.bounded(ctx)
	defer cancel()
	own, _ := p.keyName("", key)
	// A record names a version of the key's plan when its JSON starts as
	// the plan's does, up to its rules.
	same := rp.json[:strings.Index(rp.json, `"rules":`)]
	args := []any{"z", "o", "", strconv.Itoa(len(all) - 1), p.r.o.prefix, "", "9", own, same}
	if _, err := p.call(ctx, all, args); err != nil {
		err, _ = p.unanswered(key, err)
		return err
	}
	for _, op := range g.plans {
		if d := op.deny(); d != nil {
			k, _ := p.keyName(op.heads[0], key)
			d.drop(k)
		}
	}
	return nil
}
