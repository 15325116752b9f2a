package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

// ErrCrossSlot means the layers' keys of one request are in different
// Redis Cluster slots, so that no script can check them atomically (see
// [NewComposite]).
var ErrCrossSlot = errors.New("redisstore: layers' keys are in different cluster slots")

// Layer is one limit of a [Composite]: a [ratelimit.Layer] (its rule, key,
// shadow mode and OnShadow; its Options play no part), and where its key
// lives in Redis Cluster.
type Layer struct {
	ratelimit.Layer

	// Global marks a layer whose key is shared by requests of many hash
	// tags, such as a global cap: its key is in a Cluster slot of its own,
	// apart from the other layers'. A Composite with a Global layer beside
	// any other layer cannot be atomic in Redis Cluster, and NewComposite
	// refuses to build one on a Cluster client.
	Global bool
}

// WithHashTag makes a [Composite] put each layer's key in the Cluster hash
// tag tag(layer key), so that the layers of one request share a slot when
// their keys share a tag: with keys "customer route", a per-customer layer
// (key "customer") and a per-customer-and-route layer (the whole key)
// share a slot under a tag that keeps the part before the space. Without
// it each layer's key is its own tag. A [Store] ignores it.
func WithHashTag(tag func(key string) string) Option {
	return func(o *options) { o.hashTag = tag }
}

// Composite is several limits that every request must pass together, with
// their states in Redis: the Redis counterpart of [ratelimit.Composite],
// with its Decisions. A request is admitted only if every enforced layer
// admits it, and a request that any layer refuses spends nothing from any
// layer, on any replica of the application and under any concurrency: one
// script reads every layer's state, decides each at one instant with its
// layer's step, and writes the new states only if every enforced layer
// admits. The Decision is then computed in Go by the layers'
// [ratelimit.LayeredMachine] from the old states and that instant, and the
// states it computes must be the ones the script wrote (else the request is
// refused with [ErrMismatch]).
//
// Each layer's key is named by the layer's index, its rule's numbers and a
// hash of its own key (see [Composite.Key]); reordering the layers starts
// their keys fresh. In Redis Cluster every key of one script must be in one
// slot: see [WithHashTag] and [Layer].Global.
//
// It takes every option a [Store] takes, with the same meaning, and
// [WithHashTag]: a deny cache ([WithDenyCache]; none with a shadow layer),
// a circuit breaker ([WithCircuit]) and a fallback ([WithFallback], such
// as a [ratelimit.Composite] of the same layers). When Redis fails the
// error wraps [ErrUnavailable] and the Decision is the failure policy's:
// the fallback's, fail open's (the Decision on fresh keys) or fail
// closed's. It has Wait and CheckWithin as a Store has (see
// [Composite.Wait]).
type Composite struct {
	rdb      redis.UniversalClient
	lm       *ratelimit.LayeredMachine
	layers   []compLayer
	enforced int
	clock    ratelimit.Clock
	o        options
	marginMs int64
	cluster  bool // the client routes keys by slot
	oneSlot  bool // the prefix's own hash tag puts every key in one slot
	guard    bool // the client may not stop at a context's deadline
	script   *redis.Script
	br       *circuit
	deny     *denyCache // nil when off
	judge    layeredJudge

	counters
}

type compLayer struct {
	Layer
	m    *ratelimit.Machine
	p    ratelimit.Params
	alg  *algorithm // its rule's entry in the table of algorithms
	head string     // prefix, index and rule tag
	args stepArgs   // its rule's arguments to the step
}

// NewComposite returns a [Composite] of layers, in the order given, on the
// Redis rdb talks to. Each rule is validated as by [New]. On a
// [redis.ClusterClient] (or a [redis.Ring], which also spreads keys by
// hash), a Global layer beside any other layer is refused with an error
// naming the layers: their keys could never share a slot; so is, for two
// layers or more, a prefix whose '{' would make the layers' keys' hash
// tags differ (see [WithPrefix]). A prefix with a whole tag of its own puts
// every key in one slot, and then any layout, Global layers included, is
// built.
func NewComposite(rdb redis.UniversalClient, layers []Layer, opts ...Option) (*Composite, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil client", ratelimit.ErrInvalidOption)
	}
	base := make([]ratelimit.Layer, len(layers))
	for i, l := range layers {
		base[i] = l.Layer
	}
	lm, err := ratelimit.NewLayeredMachine(base)
	if err != nil {
		return nil, err
	}
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	c := &Composite{
		rdb: rdb, lm: lm, clock: o.clock, o: o, script: layersScript,
		layers:   make([]compLayer, len(layers)),
		marginMs: max(1, ceilMs(o.margin)),
		deny:     newDenyCache(o.denyCache),
		judge:    layeredJudge{lm},
	}
	switch rdb.(type) {
	case *redis.ClusterClient, *redis.Ring:
		c.cluster = true
	}
	c.guard = !honoursContext(rdb)
	c.br = newCircuit(rdb, c.guard)
	for i, l := range layers {
		m := lm.Machine(i)
		s, err := New(rdb, l.Rule, opts...) // the rule's step and arguments
		if err != nil {
			return nil, fmt.Errorf("redisstore: layer %d: %w", i, err)
		}
		// A composite never spends a refusal, as in process: under
		// CountRefused, the step reads the rule's states but counts no
		// refused cost.
		c.layers[i] = compLayer{Layer: l, m: m, p: m.Params(), alg: s.alg, args: s.lookArgs,
			head: o.prefix + "L" + strconv.Itoa(i) + ":" + ruleTag(m.Params()) + ":"}
		if !l.Shadow {
			c.enforced++
		} else {
			// Every request must reach a shadow layer's OnShadow with its
			// own answer, which a cached refusal does not have.
			c.deny = nil
		}
	}
	if c.cluster {
		tag, split := prefixTag(o.prefix)
		switch {
		case split && len(layers) > 1:
			return nil, fmt.Errorf("%w: the prefix %q has a '{' that Redis Cluster reads as the start of the keys' hash tag, "+
				"which then takes in each layer's own part of its key: the layers' keys would never share a slot. "+
				"Use a prefix without '{', or one with a whole tag of its own (such as \"{rl}:\") to put every key in one slot",
				ErrCrossSlot, o.prefix)
		case tag != "":
			c.oneSlot = true // every key in the prefix's slot: any layout
		default:
			if err := clusterLayout(layers); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// prefixTag tells how Redis Cluster (or a Ring, which hashes alike) reads
// the hash tag of a key that starts with prefix and ends with the store's
// own tag in braces, with no brace in between: Redis hashes the part
// between the key's first '{' and the first '}' after it, if that part is
// not empty, and else the whole key. A prefix without '{' leaves the
// store's own tag to be the key's. A prefix with a tag of its own ("{x}")
// makes it every key's, so that all keys share its slot: tag is that
// tag. A prefix with a '{' and no '}' after it, or with "{}", makes the
// key's tag (or the whole key) take in the layer's part of the key, which
// differs from layer to layer: split.
func prefixTag(prefix string) (tag string, split bool) {
	i := strings.IndexByte(prefix, '{')
	if i < 0 {
		return "", false
	}
	j := strings.IndexByte(prefix[i+1:], '}')
	if j <= 0 {
		return "", true
	}
	return prefix[i+1 : i+1+j], false
}

// clusterLayout refuses layers that could not share a Cluster slot.
func clusterLayout(layers []Layer) error {
	if len(layers) < 2 {
		return nil
	}
	for i, l := range layers {
		if !l.Global {
			continue
		}
		j := 0
		if i == 0 {
			j = 1
		}
		return fmt.Errorf("%w: layer %d (%s) is Global, so its key is in a slot of its own, apart from layer %d's (%s): "+
			"no script can check them atomically in Redis Cluster. Check the global limit with a Composite of its own (or a Store), "+
			"keep the per-request layers together under one tag (WithHashTag), or use a single-node client",
			ErrCrossSlot, i, layerName(l), j, layerName(layers[j]))
	}
	return nil
}

func layerName(l Layer) string {
	if m, err := ratelimit.NewMachine(l.Rule); err == nil && m.Params().Policy != "" {
		return m.Params().Policy
	}
	return "unnamed"
}

// Key returns the Redis key that holds layer i's state for a request on
// key: the prefix, the layer's index and rule tag, a hash of the layer's
// own key, and in braces the Cluster hash tag (a hash of the layer's key,
// or of its tag under [WithHashTag]).
func (c *Composite) Key(i int, key string) string {
	k, _ := c.key(i, key)
	return k
}

// key returns layer i's Redis key and its hash tag.
func (c *Composite) key(i int, key string) (string, string) {
	l := &c.layers[i]
	if l.Key != nil {
		key = l.Key(key)
	}
	return taggedKey(l.head, key, c.o.hashTag)
}

// taggedKey is the Redis key of key under head: head, then (with a hash
// tag function) a hash of key and ':', and in braces the Cluster hash tag,
// a hash of key or of hashTag(key); and that tag.
func taggedKey(head, key string, hashTag func(string) string) (name, tag string) {
	own := hash16(key)
	tag = own
	if hashTag != nil {
		tag = hash16(hashTag(key))
	}
	var b strings.Builder
	b.Grow(len(head) + 68)
	b.WriteString(head)
	if hashTag != nil {
		b.WriteString(own)
		b.WriteByte(':')
	}
	b.WriteByte('{')
	b.WriteString(tag)
	b.WriteByte('}')
	return b.String(), tag
}

// keys returns the layers' Redis keys for a request of cost on key. On a
// cluster client the keys of the layers that take part in it must share a
// slot, else the error matches [ErrCrossSlot].
func (c *Composite) keys(key string, cost ratelimit.Units) ([]string, error) {
	keys := make([]string, len(c.layers))
	tag := ""
	for i := range c.layers {
		var t string
		keys[i], t = c.key(i, key)
		if c.cluster && !c.oneSlot && c.lm.Takes(i, cost) {
			if tag != "" && t != tag {
				return nil, fmt.Errorf("%w: key %q: layer %d's key %s", ErrCrossSlot, clipKey(key), i, keys[i])
			}
			tag = t
		}
	}
	return keys, nil
}

// isCrossSlot reports Redis Cluster's refusal of a script whose keys are
// in different slots: a configuration error, which no failure policy may
// answer for (fail open would admit every request).
func isCrossSlot(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "CROSSSLOT")
}

func hash16(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

// Check is CheckContext with a background context.
func (c *Composite) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return c.CheckContext(context.Background(), key, cost)
}

// CheckContext checks cost for key on every layer, as
// [ratelimit.Composite.Check] does, in one script call. ctx bounds the
// call; without a deadline, the timeout does. Cost errors are the core's
// and reach no server. A layer's corrupted state refuses the request with
// an error matching [ratelimit.ErrInvalidState]; on a cluster client,
// layers whose keys are in different slots refuse it with [ErrCrossSlot].
// When Redis fails the error wraps [ErrUnavailable] and the Decision is the
// failure policy's. Every error but a cost error also matches
// [ratelimit.ErrDegraded]: the Decision returned with it is the one to act
// on.
func (c *Composite) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	d, shadow, err := c.check(ctx, key, cost, nil, false)
	c.observe(d, shadow, cost, err)
	return d, err
}

// observe reports a check to the observer, if any.
func (c *Composite) observe(d, shadow ratelimit.Decision, cost ratelimit.Units, err error) {
	if obs := c.o.observer; obs != nil && err == nil && d.Allowed && d.Shadowed {
		// A shadow layer's own answer, as the in-process Composite
		// reports it.
		obs.Decided(shadow, cost, ratelimit.OutcomeShadowRefused)
	} else {
		observe(obs, d.Policy, d, cost, err)
	}
}

// check is CheckContext without the observer. shadow is, for an admission
// that a shadow layer would have refused, the first such layer's Decision.
// Errors are marked as [Store]'s are (see degradedError).
// out, if not nil, gets the enforced layers' Decisions appended (see
// CheckLayers). wait says the check is an attempt of Wait, which the deny
// cache does not answer.
func (c *Composite) check(ctx context.Context, key string, cost ratelimit.Units, out *[]ratelimit.Decision, wait bool) (d, shadow ratelimit.Decision, err error) {
	d, shadow, err = c.decide(ctx, key, cost, out, wait)
	return d, shadow, degradedError(err)
}

// decide is check without marking its errors.
func (c *Composite) decide(ctx context.Context, key string, cost ratelimit.Units, out *[]ratelimit.Decision, wait bool) (d, shadow ratelimit.Decision, err error) {
	var none ratelimit.Decision
	n := c.lm.Len()
	fresh := make([][]byte, n)
	if d, _, _, err := c.lm.Step(fresh, 0, cost, false); err != nil {
		return d, none, err
	}
	keys, err := c.keys(key, cost)
	if err != nil {
		return c.refused(), none, err
	}
	var ck string
	var gen uint64
	if c.deny != nil {
		ck, gen = c.cacheKey(keys, cost), c.deny.generation()
		if !wait {
			if d, ok, _ := c.deny.answer(c.judge, c.clock, ck, cost); ok {
				c.localDenials.Add(1)
				return d, none, nil
			}
		}
	}
	args := c.args(c.reading(), cost)
	ctx, cancel := withTimeout(ctx, c.o.timeout)
	defer cancel()
	sent := time.Now()
	reply, err := c.run(ctx, key, c.script, keys, args)
	if err != nil {
		if errors.Is(err, ErrUnavailable) {
			c.failed(err)
			d, err := c.degraded(ctx, key, cost, maxBudget, err)
			return d, none, err
		}
		return c.refused(), none, err
	}
	recv := time.Now()
	v, err := c.verify(key, cost, reply, out)
	if c.deny != nil && err == nil && !v.d.Allowed {
		c.deny.remember(ck, v.old, v.at, sent, recv, gen)
	}
	return v.d, v.shadow, err
}

// reading is the client clock's reading to send a script, clamped, or
// empty for the server's TIME.
func (c *Composite) reading() string {
	if c.clock == nil {
		return ""
	}
	return strconv.FormatInt(clamp(c.clock.Now()), 10)
}

// args are layers.lua's arguments for a request of cost at now (the
// client clock's reading, or empty for the server's TIME).
func (c *Composite) args(now string, cost ratelimit.Units) []any {
	return c.boundedArgs(now, cost, false, 0)
}

// boundedArgs are args, and with bounded, for a request that may wait at
// most budget: every enforced layer whose admissions may carry a Delay (a
// leaky bucket's) is sent the bound on it too (see appendBound).
func (c *Composite) boundedArgs(now string, cost ratelimit.Units, bounded bool, budget time.Duration) []any {
	n := len(c.layers)
	args := make([]any, 0, 2+n*11)
	args = append(args, now, strconv.Itoa(n))
	for i := range c.layers {
		l := &c.layers[i]
		flag := "e"
		switch {
		case !c.lm.Takes(i, cost):
			flag = "-"
		case l.Shadow:
			flag = "s"
		}
		bound := bounded && flag == "e" && l.alg.delays
		k := len(l.args)
		if bound {
			k += len(l.alg.step.bound)
		}
		// The step's now is set in the script, to the layers' one instant.
		args = append(args, flag, strconv.Itoa(k))
		args = l.args.appendCheck(args, l.alg.step, l.m, "", cost)
		if bound {
			args = appendBound(args, l.p, budget)
		}
	}
	return args
}

// cacheKey names a request of cost on the layers' Redis keys keys in the
// deny cache: the keys of the layers that take part in it.
func (c *Composite) cacheKey(keys []string, cost ratelimit.Units) string {
	var b strings.Builder
	for i, k := range keys {
		if c.lm.Takes(i, cost) {
			b.WriteString(k)
		}
		b.WriteByte(' ')
	}
	return b.String()
}

// run sends script on the layers' keys keys (for a request on key),
// through the circuit breaker of the keys' master (they share a slot), on
// a goroutine of its own when the client might not stop at ctx's
// deadline. Its errors are ErrCircuitOpen, ErrUnavailable wrapping the
// cause, [ratelimit.ErrInvalidState] for a layer's corrupted state
// (counted) and [ErrCrossSlot] for keys in different slots. The caller
// counts a check's failures (see counters.failed).
func (c *Composite) run(ctx context.Context, key string, script scriptRunner, keys []string, args []any) ([]any, error) {
	var br *breaker
	if len(keys) > 0 {
		br = c.br.forKey(ctx, keys[0])
	} else {
		br = &c.br.one
	}
	probe, ok := br.allow(time.Now(), c.o.pause)
	if !ok {
		return nil, ErrCircuitOpen
	}
	reply, err := runScript(ctx, c.rdb, script, c.guard, keys, args)
	switch {
	case err == nil:
		br.success(probe)
		return reply, nil
	case isStateError(err):
		// The server answered: it is up, but a key cannot be used.
		br.success(probe)
		c.invalid.Add(1)
		return nil, fmt.Errorf("%w: key %q: %v", ratelimit.ErrInvalidState, clipKey(key), err)
	case isCrossSlot(err):
		br.success(probe)
		return nil, fmt.Errorf("%w: key %q: %v", ErrCrossSlot, clipKey(key), err)
	}
	br.failure(time.Now(), probe, c.o.failures, c.o.pause)
	return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// verified is a script's reply, verified: the Decision, the first shadow
// layer's that would have refused (see check), the instant the script
// decided at and the states it read.
type verified struct {
	d, shadow ratelimit.Decision
	at        int64
	old       [][]byte
}

// verify recomputes the Decision with the layered machine from the old
// states and the instant the script used, and checks that the script wrote
// exactly the states the machine computes. out, if not nil, gets the
// enforced layers' Decisions appended once all is verified.
func (c *Composite) verify(key string, cost ratelimit.Units, reply []any, out *[]ratelimit.Decision) (verified, error) {
	refused := verified{d: c.refused()}
	at, admitted, old, written, err := c.parse(reply)
	if err != nil {
		return refused, err
	}
	var layers []ratelimit.Decision
	if out != nil {
		layers = *out
	}
	d, next, reports, layers, err := c.lm.StepLayers(old, time.Duration(at), cost, true, layers)
	if err != nil {
		if errors.Is(err, ratelimit.ErrInvalidState) {
			c.invalid.Add(1)
		}
		return refused, fmt.Errorf("key %q: %w", clipKey(key), err)
	}
	if c.enforced > 0 && d.Allowed != (admitted == 1) {
		c.mismatches.Add(1)
		return refused, fmt.Errorf("%w: key %q at %d: script admitted %d, machine %v", ErrMismatch, clipKey(key), at, admitted, d.Allowed)
	}
	if err := c.sameWritten(key, at, old, next, written); err != nil {
		return refused, err
	}
	if out != nil {
		*out = layers
	}
	shadow := c.report(key, reports)
	return verified{d: d, shadow: shadow, at: at, old: old}, nil
}

// parse reads the layers' script's reply (see layers.lua): the instant,
// whether every enforced layer admitted, and per layer the state read and
// the state written; a reply of another shape is an error wrapping
// ErrMismatch (counted).
func (c *Composite) parse(reply []any) (at, admitted int64, old [][]byte, written []string, err error) {
	n := c.lm.Len()
	bad := func() (int64, int64, [][]byte, []string, error) {
		c.mismatches.Add(1)
		return 0, 0, nil, nil, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
	}
	if len(reply) != 2+2*n {
		return bad()
	}
	reading, ok := reply[0].(string)
	at, err = strconv.ParseInt(reading, 10, 64)
	admitted, ok2 := reply[1].(int64)
	if !ok || !ok2 || err != nil {
		return bad()
	}
	old = make([][]byte, n)
	written = make([]string, n)
	for i := range n {
		o, ok1 := reply[2+2*i].(string)
		w, ok2 := reply[3+2*i].(string)
		if !ok1 || !ok2 {
			return bad()
		}
		old[i], written[i] = []byte(o), w
	}
	return at, admitted, old, written, nil
}

// sameWritten checks that the script wrote in each layer the state next
// the machine computes from old (an empty string, for nothing written,
// where the state is unchanged); a difference is an error wrapping
// ErrMismatch (counted).
func (c *Composite) sameWritten(key string, at int64, old, next [][]byte, written []string) error {
	for i := range written {
		want := string(next[i])
		if written[i] == "" {
			want = ""
			if string(next[i]) != string(old[i]) {
				want = string(next[i])
			}
		}
		if written[i] != want {
			c.mismatches.Add(1)
			return fmt.Errorf("%w: key %q layer %d at %d: script wrote %q, machine %q", ErrMismatch, clipKey(key), i, at, clipKey(written[i]), clipKey(want))
		}
	}
	return nil
}

// report gives each shadow layer's report of a request on key to its
// OnShadow, and returns the Decision of the first shadow layer that would
// have refused the request, if any.
func (c *Composite) report(key string, reports []ratelimit.ShadowReport) ratelimit.Decision {
	var shadow ratelimit.Decision
	refusing := false
	r := 0
	for i := range c.layers {
		l := &c.layers[i]
		if !l.Shadow {
			continue
		}
		if r < len(reports) && !refusing && (reports[r].Err != nil || !reports[r].Decision.Allowed) {
			shadow, refusing = reports[r].Decision, true
		}
		if r < len(reports) && l.OnShadow != nil {
			rep := reports[r]
			rep.Key = key
			if l.Key != nil {
				rep.Key = l.Key(key)
			}
			l.OnShadow(rep)
		}
		r++
	}
	return shadow
}

// refused is the Decision that admits nothing: the first enforced layer's.
func (c *Composite) refused() ratelimit.Decision {
	for _, l := range c.layers {
		if !l.Shadow {
			return ratelimit.Decision{Limit: l.p.Limit, Policy: l.p.Policy, Window: l.p.Window}
		}
	}
	p := c.layers[0].p
	return ratelimit.Decision{Limit: p.Limit, Policy: p.Policy, Window: p.Window}
}

// degraded applies the failure policy to a request Redis did not decide
// because of cause, for a request that may wait at most maxDelay
// (maxBudget: any time): the fallback's Decision if there is one, else
// fail open's (the Decision on fresh keys) or fail closed's.
func (c *Composite) degraded(ctx context.Context, key string, cost ratelimit.Units, maxDelay time.Duration, cause error) (ratelimit.Decision, error) {
	if d, err, ok := fallBack(ctx, c.o.fallback, key, cost, maxDelay, cause); ok {
		return d, err
	}
	return c.failureMode(cost), cause
}

// failureMode is the failure mode's Decision for cost, spending nothing
// anywhere.
func (c *Composite) failureMode(cost ratelimit.Units) ratelimit.Decision {
	if c.o.mode == FailClosed {
		d := c.refused()
		d.RetryAfter = c.o.pause
		return d
	}
	now := time.Duration(clamp(UnixClock().Now()))
	if c.clock != nil {
		now = time.Duration(clamp(c.clock.Now()))
	}
	d, _, _, _ := c.lm.Step(make([][]byte, c.lm.Len()), now, cost, false)
	return d
}

// layeredJudge is a Composite's judge for its deny cache: its layers on
// their states.
type layeredJudge struct{ lm *ratelimit.LayeredMachine }

// refusal decides as a Composite's check does; Redis writes nothing for a
// refused request, so the states are left as they are.
func (j layeredJudge) refusal(states [][]byte, now time.Duration, cost ratelimit.Units) (ratelimit.Decision, [][]byte, error) {
	d, _, _, err := j.lm.Step(states, now, cost, false)
	return d, states, err
}

// worst drains every layer that takes part: other requests, on this key
// or on others that share a layer's key, may have spent all each admits.
// The refusal keeps describing the layer d describes, which may then not
// be the one Redis describes (another may refuse longer), so its
// ResetAfter is the longest of every layer's in the worst case.
func (j layeredJudge) worst(d ratelimit.Decision, states [][]byte, now time.Duration, cost ratelimit.Units) ratelimit.Decision {
	drained := append([][]byte(nil), states...)
	for i := range states {
		if !j.lm.Takes(i, cost) {
			continue
		}
		m := j.lm.Machine(i)
		if x := drain(m, states[i], now, cost); x != nil {
			drained[i] = x
		}
		if l, _, err := m.Step(drained[i], now, cost, false); err == nil {
			d.ResetAfter = max(d.ResetAfter, l.ResetAfter)
		}
	}
	if w, _, _, err := j.lm.Step(drained, now, cost, false); err == nil {
		d = worstOf(d, w)
	}
	return d
}

var (
	_ ratelimit.ContextChecker = (*Composite)(nil)
	_ ratelimit.KeyedLimiter   = (*Composite)(nil)
)
