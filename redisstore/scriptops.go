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

	settleArgs = []*slot{settleNow, settleMode, settleCost, settleActual, settleAt, settleMargin, settlePace,
		settlePeriod, settleTau, settleTauFrac, settleCapacity, settleCostSpan, settleCostFrac, settleAlg, settleBuckets}
)

// scriptReply is settle.lua's reply: the state it read, the instant it
// read, the state it wrote (nil for none), the amount given back or the
// cost as settled, and the expiry it set in ms (empty for none).
type scriptReply struct {
	old     []byte
	instant int64
	written []byte
	x       int64
	px      string
}

// scriptOp runs settle.lua on the store's key rk in mode ("r" or "s")
// with the costs a and b (b for a settlement only) and the admitting
// instant at.
func (s *Store) scriptOp(ctx context.Context, rk, mode string, a, b ratelimit.Units, at time.Duration) (scriptReply, error) {
	p := s.p
	bs := ""
	var cn, cf uint64
	if mode == "s" {
		bs = strconv.FormatInt(int64(b), 10)
		cn, cf = s.m.Span(a)
	}
	args := make([]any, len(settleArgs))
	args[settleMode.at] = mode
	args[settleCost.at] = strconv.FormatInt(int64(a), 10)
	args[settleActual.at] = bs
	args[settleAt.at] = strconv.FormatInt(int64(max(at, 0)), 10)
	args[settleMargin.at] = strconv.FormatInt(s.marginMs, 10)
	if s.alg.step.takes(argWindow) {
		args[settleWindow.at], args[settleRefused.at] = strconv.FormatInt(p.WindowNanos, 10), "0"
		if p.CountRefused {
			args[settleRefused.at] = "1"
		}
	} else {
		args[settlePace.at], args[settlePeriod.at] = u(p.RateUnits), u(p.RateNanos)
	}
	args[settleTau.at], args[settleTauFrac.at] = u(p.TauNanos), u(p.TauFrac)
	args[settleCapacity.at] = strconv.FormatInt(int64(p.Capacity), 10)
	args[settleCostSpan.at], args[settleCostFrac.at] = u(cn), u(cf)
	args[settleAlg.at] = s.alg.step.code
	args[settleBuckets.at] = ""
	if s.alg.step.takes(argBuckets) {
		args[settleBuckets.at] = strconv.FormatInt(p.Buckets, 10)
	}
	// runOn sends the instant first, as settleNow.
	reply, err := s.runOn(ctx, rk, s.floor(rk), settleScript, args[settleNow.at+1:]...)
	if err != nil {
		return scriptReply{}, err
	}
	var r scriptReply
	var f [5]string
	ok := len(reply) == 5
	for i := range f {
		var oki bool
		f[i], oki = str(reply, i)
		ok = ok && oki
	}
	var e1, e2 error
	r.instant, e1 = strconv.ParseInt(f[1], 10, 64)
	r.x, e2 = strconv.ParseInt(f[3], 10, 64)
	if !ok || e1 != nil || e2 != nil {
		s.mismatches.Add(1)
		return scriptReply{}, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
	}
	r.old, r.px = []byte(f[0]), f[4]
	if f[2] != "" {
		r.written = []byte(f[2])
	}
	return r, nil
}

// agree checks that the script wrote next (nil: the state it read, left
// as it was) and gave back or settled x, as the Machine did on the same
// state and instant; a disagreement is counted and is an error wrapping
// ErrMismatch.
func (s *Store) agree(key string, r scriptReply, x int64, next []byte, px string) error {
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
