package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

// settleLua refunds and settles a key of any rule in one script (see
// settle.lua), after the limb arithmetic it uses.
//
//go:embed settle.lua
var settleLua string

var (
	settleSource = expandLua(arithLua + "\n" + settleLua)
	settleScript = redis.NewScript(settleSource)
)

// settle.lua's arguments, which it names SARG_<name> (see expandLua).
var (
	settleNow      = &slot{at: 0, name: "NOW"}        // now in ns since the Unix epoch, or '' for the server's TIME
	settleMode     = &slot{at: 1, name: "MODE"}       // 'r' refund, 's' settle
	settleCost     = &slot{at: 2, name: "COST"}       // the cost to give back, or the cost charged
	settleActual   = &slot{at: 3, name: "ACTUAL"}     // a settlement's actual cost
	settleAt       = &slot{at: 4, name: "AT"}         // the admitting Decision's At
	settleMargin   = &slot{at: 5, name: "MARGIN"}     // the expiry margin in ms
	settlePace     = &slot{at: 6, name: "PACE"}       // a bucket rule's pace: n milli-units
	settleWindow   = &slot{at: 6, name: "WINDOW"}     // a window rule's window, ns
	settlePeriod   = &slot{at: 7, name: "PERIOD"}     // a bucket rule's pace: per p ns
	settleRefused  = &slot{at: 7, name: "REFUSED"}    // a window rule's CountRefused: '1' or '0'
	settleTau      = &slot{at: 8, name: "TAU"}        // the capacity's span: ns
	settleTauFrac  = &slot{at: 9, name: "TAU_FRAC"}   // and frac/n
	settleCapacity = &slot{at: 10, name: "CAPACITY"}  // the capacity, milli-units
	settleCostSpan = &slot{at: 11, name: "COST_SPAN"} // a settlement's cost charged: its span, ns
	settleCostFrac = &slot{at: 12, name: "COST_FRAC"} // and frac/n
	settleAlg      = &slot{at: 13, name: "ALG"}       // the rule's step's code
	settleBuckets  = &slot{at: 14, name: "BUCKETS"}   // a sub-window's buckets, '' for the other rules
	settleKeep     = &slot{at: 15, name: "KEEP"}      // '1' for a key only read, '' for one settled

	settleArgs = []*slot{settleNow, settleMode, settleCost, settleActual, settleAt, settleMargin, settlePace,
		settlePeriod, settleTau, settleTauFrac, settleCapacity, settleCostSpan, settleCostFrac, settleAlg, settleBuckets,
		settleKeep}
)

// settleBlock is the length of settle.lua's arguments per key, from
// settlePace on (the script's PER).
var settleBlock = len(settleArgs) - settlePace.at

// scriptReply is settle.lua's reply for one key: the state it read, the
// instant it read (the same for every key), the state it wrote (nil for
// none), the amount given back or the cost as settled, and the expiry it
// set in ms (empty for none).
type scriptReply struct {
	old     []byte
	instant int64
	written []byte
	x       int64
	px      string
}

// settleHead returns settle.lua's arguments for keys keys, the instant
// now (empty for the server's TIME) first, in mode ("r" or "s") with the
// costs a and b (b for a settlement only) and the admitting instant at,
// with every key's block still to fill (see settleKey).
func settleHead(keys int, now, mode string, a, b ratelimit.Units, at time.Duration, marginMs int64) []any {
	bs := ""
	if mode == "s" {
		bs = strconv.FormatInt(int64(b), 10)
	}
	args := make([]any, settlePace.at+keys*settleBlock)
	args[settleNow.at] = now
	args[settleMode.at] = mode
	args[settleCost.at] = strconv.FormatInt(int64(a), 10)
	args[settleActual.at] = bs
	args[settleAt.at] = strconv.FormatInt(int64(max(at, 0)), 10)
	args[settleMargin.at] = strconv.FormatInt(marginMs, 10)
	return args
}

// settleKey fills key i's block of args (see settleHead) for a rule of
// the algorithm alg with the Machine m, in mode with the cost a; keep
// makes the key one the script only reads (and checks).
func settleKey(args []any, i int, alg *algorithm, m *ratelimit.Machine, mode string, a ratelimit.Units, keep bool) {
	blk := args[i*settleBlock:]
	for _, sl := range settleArgs[settlePace.at:] {
		blk[sl.at] = ""
	}
	if keep {
		blk[settleKeep.at] = "1"
	}
	p := m.Params()
	var cn, cf uint64
	if mode == "s" {
		cn, cf = m.Span(a)
	}
	if alg.step.takes(argWindow) {
		blk[settleWindow.at], blk[settleRefused.at] = strconv.FormatInt(p.WindowNanos, 10), "0"
		if p.CountRefused {
			blk[settleRefused.at] = "1"
		}
	} else {
		blk[settlePace.at], blk[settlePeriod.at] = u(p.RateUnits), u(p.RateNanos)
	}
	blk[settleTau.at], blk[settleTauFrac.at] = u(p.TauNanos), u(p.TauFrac)
	blk[settleCapacity.at] = strconv.FormatInt(int64(p.Capacity), 10)
	blk[settleCostSpan.at], blk[settleCostFrac.at] = u(cn), u(cf)
	blk[settleAlg.at] = alg.step.code
	if alg.step.takes(argBuckets) {
		blk[settleBuckets.at] = strconv.FormatInt(p.Buckets, 10)
	}
}

// parseSettle reads settle.lua's reply for keys keys: the instant it
// read and each key's reply; false for a reply that is not one.
func parseSettle(reply []any, keys int) (int64, []scriptReply, bool) {
	reading, ok := str(reply, 0)
	instant, err := strconv.ParseInt(reading, 10, 64)
	if !ok || err != nil || len(reply) != 1+4*keys {
		return 0, nil, false
	}
	rs := make([]scriptReply, keys)
	for i := range rs {
		var f [4]string
		for k := range f {
			if f[k], ok = str(reply, 1+4*i+k); !ok {
				return 0, nil, false
			}
		}
		r := &rs[i]
		if r.x, err = strconv.ParseInt(f[2], 10, 64); err != nil {
			return 0, nil, false
		}
		r.old, r.instant, r.px = []byte(f[0]), instant, f[3]
		if f[1] != "" {
			r.written = []byte(f[1])
		}
	}
	return instant, rs, true
}

// scriptOp runs settle.lua on the store's key rk in mode ("r" or "s")
// with the costs a and b (b for a settlement only) and the admitting
// instant at.
func (s *Store) scriptOp(ctx context.Context, rk, mode string, a, b ratelimit.Units, at time.Duration) (scriptReply, error) {
	args := s.settleArgs("", mode, a, b, at)
	// runOn sends the instant first, as settleNow.
	reply, err := s.runOn(ctx, rk, s.floor(rk), settleScript, args[settleNow.at+1:]...)
	if err != nil {
		return scriptReply{}, err
	}
	return s.settleReply(reply)
}

// settleArgs are settle.lua's arguments for the store's key at now (empty
// for the server's TIME), as scriptOp describes them.
func (s *Store) settleArgs(now, mode string, a, b ratelimit.Units, at time.Duration) []any {
	args := settleHead(1, now, mode, a, b, at, s.marginMs)
	settleKey(args, 0, s.alg, s.m, mode, a, false)
	return args
}

// settleReply reads settle.lua's reply for the store's key.
func (s *Store) settleReply(reply []any) (scriptReply, error) {
	_, rs, ok := parseSettle(reply, 1)
	if !ok {
		s.mismatches.Add(1)
		return scriptReply{}, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
	}
	return rs[0], nil
}

// agree checks that the script wrote next (nil: the state it read, left
// as it was) and gave back or settled x, as the Machine did on the same
// state and instant; a disagreement is counted and is an error wrapping
// ErrMismatch.
func (s *counters) agree(key string, r scriptReply, x int64, next []byte, px string) error {
	want := r.written
	if want == nil {
		want = r.old
	}
	if x != r.x || string(next) != string(want) || px != r.px {
		s.mismatches.Add(1)
		return fmt.Errorf("%w: key %q: the script wrote %q (%d, expiry %q), the machine %q (%d, expiry %q)",
			ErrMismatch, clipKey(key), want, r.x, r.px, next, x, px)
	}
	return nil
}

// refundInScript is RefundContext's refund, in one script.
func (s *Store) refundInScript(ctx context.Context, key, rk string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	r, err := s.scriptOp(ctx, rk, "r", min(cost, s.p.Capacity), 0, at)
	if err != nil {
		return 0, err
	}
	return s.refunded(key, rk, r, cost, at)
}

// refunded checks the refund settle.lua made on the store's key rk (for
// key) against the Machine, and returns the amount given back.
func (s *Store) refunded(key, rk string, r scriptReply, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	g, next, err := s.m.Refund(r.old, time.Duration(r.instant), at, cost)
	if err != nil {
		s.mismatches.Add(1)
		return 0, fmt.Errorf("%w: key %q: %w", ErrMismatch, clipKey(key), err)
	}
	if err := s.agree(key, r, int64(g), next, ""); err != nil {
		return 0, err
	}
	if r.written != nil && s.deny != nil {
		s.deny.drop(rk)
	}
	return g, nil
}

// settleInScript is SettleContext's settlement, in one script.
func (s *Store) settleInScript(ctx context.Context, key, rk string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	sent := time.Now()
	r, err := s.scriptOp(ctx, rk, "s", charged, actual, at)
	recv := time.Now()
	if err != nil {
		return s.refused(), 0, err
	}
	return s.settled(key, rk, r, charged, actual, at, sent, recv)
}

// settled checks the settlement settle.lua made on the store's key rk (for
// key), in a call sent at sent whose reply came back at recv, against the
// Machine, and returns its Decision and the settled cost.
func (s *Store) settled(key, rk string, r scriptReply, charged, actual ratelimit.Units, at time.Duration, sent, recv time.Time) (ratelimit.Decision, ratelimit.Units, error) {
	d, settled, next, err := s.m.Settle(r.old, time.Duration(r.instant), at, charged, actual)
	if err != nil {
		s.mismatches.Add(1)
		return s.refused(), 0, fmt.Errorf("%w: key %q: %w", ErrMismatch, clipKey(key), err)
	}
	px := ""
	if actual > charged {
		px = strconv.FormatInt(expiryMs(d.ResetAfter, s.marginMs), 10)
	}
	if r.written == nil {
		px = "" // nothing written: no expiry set
	}
	if err := s.agree(key, r, int64(settled), next, px); err != nil {
		return s.refused(), 0, err
	}
	switch {
	case r.written == nil || s.deny == nil:
	case actual < charged:
		s.deny.drop(rk)
	default:
		s.deny.charged(rk, r.written, r.instant, sent, recv)
	}
	return d, settled, nil
}

// scriptOp runs settle.lua on the layers' keys for key that take part in
// a request of part (see Composite.keys), in mode with the costs a and b
// and the admitting instant at: every enforced layer's key is refunded
// or settled, a shadow layer's only read. It returns every layer's
// reply, a layer that does not take part reading as a fresh key, and the
// one instant the layers are settled at.
func (c *Composite) scriptOp(ctx context.Context, key, mode string, a, b ratelimit.Units, at time.Duration, part ratelimit.Units) ([]scriptReply, time.Duration, error) {
	_, send, now, err := c.taking(key, part)
	if err != nil {
		return nil, 0, err
	}
	reply, err := c.run(ctx, key, settleScript, send, c.settleArgs(now, mode, a, b, at, part))
	if err != nil {
		return nil, 0, err
	}
	return c.settleReplies(key, reply, part)
}

// settleArgs are settle.lua's arguments for the keys of the layers that
// take part in a request of part, at now (empty for the server's TIME), as
// scriptOp describes them.
func (c *Composite) settleArgs(now, mode string, a, b ratelimit.Units, at time.Duration, part ratelimit.Units) []any {
	n := c.lm.Len()
	args := settleHead(c.takers(part), now, mode, a, b, at, c.marginMs)
	j := 0
	for i := range n {
		if !c.lm.Takes(i, part) {
			continue
		}
		settleKey(args, j, c.layers[i].alg, c.lm.Machine(i), mode, a, c.layers[i].Shadow)
		j++
	}
	return args
}

// takers is the number of layers that take part in a request of part.
func (c *Composite) takers(part ratelimit.Units) int {
	k := 0
	for i := range c.lm.Len() {
		if c.lm.Takes(i, part) {
			k++
		}
	}
	return k
}

// settleReplies reads settle.lua's reply for the keys of the layers that
// take part in a request of part: every layer's reply (a layer that does
// not take part reads as a fresh key) and the layers' one instant.
func (c *Composite) settleReplies(key string, reply []any, part ratelimit.Units) ([]scriptReply, time.Duration, error) {
	n := c.lm.Len()
	reading, sent, ok := parseSettle(reply, c.takers(part))
	if !ok {
		c.mismatches.Add(1)
		return nil, 0, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
	}
	rs := make([]scriptReply, n)
	states := make([][]byte, n)
	j := 0
	for i := range n {
		if c.lm.Takes(i, part) {
			rs[i], states[i] = sent[j], sent[j].old
			j++
		}
	}
	inst, err := c.lm.Instant(states, time.Duration(reading), part)
	if err != nil {
		c.mismatches.Add(1)
		return nil, 0, fmt.Errorf("%w: key %q: %w", ErrMismatch, clipKey(key), err)
	}
	return rs, inst, nil
}

// refundInScript is RefundContext's refund, in one script: every enforced
// layer gives back what its Machine gives back, at the layers' one
// instant, and the least of them is returned.
func (c *Composite) refundInScript(ctx context.Context, key string, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	// Every layer takes part, as in process (the least cost takes all).
	rs, now, err := c.scriptOp(ctx, key, "r", cost, 0, at, 1)
	if err != nil {
		return 0, err
	}
	return c.refunded(key, rs, now, cost, at)
}

// refunded checks the refunds settle.lua made in every layer at the
// instant now against the layers' Machines, and returns the least amount
// an enforced layer gave back.
func (c *Composite) refunded(key string, rs []scriptReply, now time.Duration, cost ratelimit.Units, at time.Duration) (ratelimit.Units, error) {
	least := ratelimit.Units(-1)
	for i := range rs {
		if c.layers[i].Shadow {
			continue
		}
		g, next, err := c.lm.Machine(i).Refund(rs[i].old, now, at, cost)
		if err != nil {
			c.mismatches.Add(1)
			return 0, fmt.Errorf("%w: key %q layer %d: %w", ErrMismatch, clipKey(key), i, err)
		}
		if err := c.agree(key, rs[i], int64(g), next, ""); err != nil {
			return 0, fmt.Errorf("layer %d: %w", i, err)
		}
		if least < 0 || g < least {
			least = g
		}
	}
	return max(least, 0), nil
}

// settleInScript is SettleContext's settlement, in one script: every
// enforced layer settles as its Machine does, at the layers' one instant.
// It returns the Decision for cost charged just after, and the settled
// cost furthest from actual.
func (c *Composite) settleInScript(ctx context.Context, key string, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	// The layers that take part in a request of cost charged, as in
	// process.
	rs, now, err := c.scriptOp(ctx, key, "s", charged, actual, at, charged)
	if err != nil {
		return c.refused(), 0, err
	}
	return c.settled(key, rs, now, charged, actual, at)
}

// settled checks the settlements settle.lua made in every layer at the
// instant now against the layers' Machines, and returns the Decision for
// cost charged just after and the settled cost furthest from actual.
func (c *Composite) settled(key string, rs []scriptReply, now time.Duration, charged, actual ratelimit.Units, at time.Duration) (ratelimit.Decision, ratelimit.Units, error) {
	settled, first := charged, true
	after := make([][]byte, len(rs))
	for i := range rs {
		after[i] = rs[i].old
		if c.layers[i].Shadow {
			continue
		}
		ld, x, next, err := c.lm.Machine(i).Settle(rs[i].old, now, at, charged, actual)
		if err != nil {
			c.mismatches.Add(1)
			return c.refused(), 0, fmt.Errorf("%w: key %q layer %d: %w", ErrMismatch, clipKey(key), i, err)
		}
		px := ""
		if actual > charged && rs[i].written != nil {
			px = strconv.FormatInt(expiryMs(ld.ResetAfter, c.marginMs), 10)
		}
		if err := c.agree(key, rs[i], int64(x), next, px); err != nil {
			return c.refused(), 0, fmt.Errorf("layer %d: %w", i, err)
		}
		if first || absUnits(x-actual) > absUnits(settled-actual) {
			settled, first = x, false
		}
		after[i] = next
	}
	d, _, _, err := c.lm.Step(after, now, charged, false)
	if err != nil {
		c.mismatches.Add(1)
		return c.refused(), 0, fmt.Errorf("%w: key %q: %w", ErrMismatch, clipKey(key), err)
	}
	return d, settled, nil
}
