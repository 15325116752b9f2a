package redisstore

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/redis/go-redis/v9"
)

// Plans is the Redis counterpart of [ratelimit.Plans]: a keyed limiter
// that picks each key's rule at check time from a [ratelimit.PlanSet] and a
// plan function (or the plan a context names, see
// [ratelimit.ContextWithPlan]), with its keys' states in Redis, shared by
// every replica of the application. It gives the in-process Plans'
// Decisions on the same trace, moves included: when a key's plan changes,
// or [Plans.Update] changes its plan's rule, the key's state moves to its
// new rule the next time it is checked, converted by the same
// [ratelimit.Migration] code (see [ratelimit.MoveState]); there is no pass
// over the keys.
//
// Each key has a record in Redis beside its state (see [Plans.RecordKey]),
// in the same Cluster slot: the keys of the plan that holds its state, that
// plan's rules as JSON, and what its last move carried in. A check of a key
// its plan holds, or of a key new to Redis, is one script call: the script
// reads the record and, if it names the plan's keys (or there is none),
// checks as a [Store] (a plan of one rule) or a [Composite] (a plan of
// layers) does and keeps the record at least as long as the state. If the
// record names another plan's keys, or the same plan's under other rules,
// the script returns the record and the states, writing nothing; the move
// is computed in Go, from the rules the record names, so that a replica
// on another rule set can read it, and a second script writes it over the
// old keys, the new keys and the record only if all of them still hold
// what was read, and then checks. A move that finds them changed (another
// replica moved the key first) starts over, a few times at most within
// the deadline.
//
// A plan's keys are named by the plan's name, the layer's index and its
// rule (its JSON, name included), so that every replica on the same rule
// set shares them, and a plan whose rule is unchanged by an Update keeps
// its keys as they are. Replicas on different rule sets during a rolling
// reload move a key back and forth as its checks alternate between them:
// each move is a move of the in-process Plans, so no move hands out a fresh
// allowance (see [ratelimit.Migration] for the bound), except under
// MigrateReset, which resets the key at every move onto the rules it was
// asked for: finish a rolling reload before an Update with MigrateReset.
// A replica moving a key off rules of its plan that it never ran (another
// replica's newer ones) uses the policy the record says the key was moved
// onto them with (else the policy of its own latest Update), so that a key
// moved back and forth loses nothing one way that the other gives back;
// MigrateProportional stands in for MigrateReset there. A move between
// different plans uses the set's OnMove, as in process, and leaves the
// keys of the old plan's layers with a Key (shared by the plan's keys) as
// they are; an Update's change of such a layer's rule moves its state once,
// as in process (see [ratelimit.Migration]). A key that moved onto a plan
// whose every layer has a Key keeps, as in process, a record naming the
// plan it came from: each check of it on that plan is two script calls,
// as a move's is, for as long as the record lives.
//
// Of the options, Plans reads [WithPrefix], [WithClock], [WithTimeout],
// [WithExpiryMargin], [WithFailureMode], [WithFallback] (a local limiter,
// such as a [ratelimit.Plans]), [WithCircuit], [WithObserver],
// [WithHashTag] and [WithDenyCache] (each plan of one rule has a deny
// cache of that size, as a Store has; a plan of layers has none). When
// Redis fails, the error wraps [ErrUnavailable] and the Decision is the
// failure policy's. A corrupted
// record or state refuses with an error matching
// [ratelimit.ErrInvalidState], whatever the policy. Plans is safe for
// concurrent use, starts no goroutines of its own and has nothing to
// close. It has Check, CheckContext, CheckWithin, Wait, Peek, Refund,
// Settle and Reset (see [Plans.CheckWithinContext] and
// [Plans.PeekContext]).
type Plans struct {
	r        *remote
	planOf   func(string) string
	marginMs int64
	cluster  bool // the client routes keys by slot
	oneSlot  bool // the prefix's own hash tag puts every key in one slot
	update   sync.Mutex
	gen      atomic.Pointer[plansGen]
	known    recordedPlans

	moves, conflicts atomic.Uint64
}

// plansGen is one rule set as built.
type plansGen struct {
	set   ratelimit.PlanSet
	plans map[string]*redisPlan
	def   *redisPlan
	// replaced is, by a plan's JSON (see redisPlan.json), the policy of
	// the Update that replaced it under the same name, for every plan an
	// Update of this Plans replaced (the latest maxReplaced).
	replaced map[string]ratelimit.Migration
	order    []string // replaced's keys, oldest first
	last     ratelimit.Migration
	// shared is whether a plan of the set, or of a set before it, has a
	// layer with a Key, as in process: a state that holds nothing spent
	// then counts as none when a key's record names other keys (see move).
	shared bool
	// done ends when an Update replaces this set, to wake waiters.
	done   context.Context
	cancel context.CancelFunc
}

// maxReplaced bounds how many replaced plans a Plans remembers the
// policies of.
const maxReplaced = 1024

// redisPlan is a plan as built.
type redisPlan struct {
	name   string
	json   string   // {"plan": name, "rules": [...]}, the record's second line
	heads  []string // each layer's key head: prefix, "P", a hash of the plan's name, the index and the rule
	keyFns []func(string) string
	// own is whether a layer of the plan is the key's own (has no Key): a
	// key's move onto a plan without one keeps its record (see move).
	own    bool
	single *Store     // a plan of one rule, with no Key and no Shadow
	comp   *Composite // a plan of layers
	// counts is whether a check spends a refusal the rule counts, as a
	// Store's Check does: for a plan of one Rule (not of Layers).
	counts bool
}

// NewPlans returns a [Plans] over set on the Redis rdb talks to. set is
// validated as by [ratelimit.NewPlans], and every rule as by [New]. planOf
// returns a key's plan name (nil: every key on the default plan); it must
// be safe for concurrent use and quick. Options are [Store]'s (see
// [Plans]); on a [redis.ClusterClient] or a [redis.Ring], a plan of layers
// whose keys could not share a slot is refused as [NewComposite] refuses
// it.
func NewPlans(rdb redis.UniversalClient, set ratelimit.PlanSet, planOf func(key string) string, opts ...Option) (*Plans, error) {
	r, err := newRemote(rdb, nil, opts)
	if err != nil {
		return nil, err
	}
	p := &Plans{r: r, planOf: planOf, marginMs: max(1, ceilMs(r.o.margin))}
	switch rdb.(type) {
	case *redis.ClusterClient, *redis.Ring:
		p.cluster = true
		tag, _ := prefixTag(r.o.prefix)
		p.oneSlot = tag != ""
	}
	g, err := p.build(set, nil, ratelimit.MigrateProportional)
	if err != nil {
		return nil, err
	}
	p.gen.Store(g)
	return p, nil
}

// Update replaces the rule set with set, atomically for this Plans: every
// check after Update returns sees set. Keys whose plan's rule changed keep
// what m says when next checked, on this replica or any other that runs
// set; keys of plans whose rules are unchanged keep their state. A set
// that does not validate is refused whole.
func (p *Plans) Update(set ratelimit.PlanSet, m ratelimit.Migration) error {
	if m > ratelimit.MigrateReset {
		return fmt.Errorf("%w: Update: %v is not a migration policy", ratelimit.ErrInvalidOption, m)
	}
	p.update.Lock()
	defer p.update.Unlock()
	old := p.gen.Load()
	g, err := p.build(set, old, m)
	if err != nil {
		return err
	}
	p.gen.Store(g)
	old.cancel()
	return nil
}

// Set returns the rule set in force.
func (p *Plans) Set() ratelimit.PlanSet { return p.gen.Load().set.Clone() }

// Clock returns the time base of the decisions: the client clock, or Unix
// time when the server's clock decides.
func (p *Plans) Clock() ratelimit.Clock { return p.r.clock() }

// PlansStats are a [Plans]' counters since it was built (LocalDenials:
// of the plans in force).
type PlansStats struct {
	Stats
	// Moves counts keys moved to another plan or rule.
	Moves uint64
	// Conflicts counts moves that found the key changed by another check
	// between reading it and writing it, and started over.
	Conflicts uint64
}

// Stats returns the counters.
func (p *Plans) Stats() PlansStats {
	st := PlansStats{Stats: p.r.stats(), Moves: p.moves.Load(), Conflicts: p.conflicts.Load()}
	for _, rp := range p.gen.Load().plans {
		if rp.single != nil {
			st.LocalDenials += rp.single.localDenials.Load()
			st.Mismatches += rp.single.mismatches.Load()
			st.InvalidStates += rp.single.invalid.Load()
		} else {
			st.Mismatches += rp.comp.mismatches.Load()
			st.InvalidStates += rp.comp.invalid.Load()
		}
	}
	return st
}

// build validates set and builds its generation after old (nil for the
// first), replaced by an Update with policy m.
func (p *Plans) build(set ratelimit.PlanSet, old *plansGen, m ratelimit.Migration) (*plansGen, error) {
	set = set.Clone()
	if len(set.Plans) == 0 {
		return nil, &ratelimit.RuleError{Rule: "PlanSet", Field: "Plans", Reason: "is empty"}
	}
	if _, ok := set.Plans[set.Default]; !ok {
		return nil, &ratelimit.RuleError{Rule: "PlanSet", Field: "Default", Reason: fmt.Sprintf("%q is not one of the plans", set.Default)}
	}
	if set.OnMove > ratelimit.MigrateReset {
		return nil, &ratelimit.RuleError{Rule: "PlanSet", Field: "OnMove", Reason: fmt.Sprintf("%v is not a migration policy", set.OnMove)}
	}
	g := &plansGen{set: set, plans: make(map[string]*redisPlan, len(set.Plans)), replaced: map[string]ratelimit.Migration{}, last: m}
	for name, pl := range set.Plans {
		rp, err := p.buildPlan(name, pl)
		if err != nil {
			return nil, err
		}
		g.plans[name] = rp
	}
	g.def = g.plans[set.Default]
	g.done, g.cancel = context.WithCancel(context.Background())
	g.shared = old != nil && old.shared
	for _, pl := range set.Plans {
		for _, l := range pl.Layers {
			g.shared = g.shared || l.Key != nil
		}
	}
	if old != nil {
		for _, k := range old.order {
			g.remember(k, old.replaced[k])
		}
		for name, rp := range old.plans {
			if now, ok := g.plans[name]; !ok || now.json != rp.json {
				g.remember(rp.json, m)
			}
		}
	}
	return g, nil
}

// remember notes the policy of the Update that replaced a plan.
func (g *plansGen) remember(planJSON string, m ratelimit.Migration) {
	if _, ok := g.replaced[planJSON]; !ok {
		g.order = append(g.order, planJSON)
	}
	g.replaced[planJSON] = m
	if len(g.order) > maxReplaced {
		delete(g.replaced, g.order[0])
		g.order = g.order[1:]
	}
}

// planJSON is a record's second line: a plan's name and rules, which any
// replica can read the plan's states by.
type planJSON struct {
	Plan  string            `json:"plan"`
	Rules []json.RawMessage `json:"rules"`
}

// buildPlan builds one plan.
func (p *Plans) buildPlan(name string, pl ratelimit.Plan) (*redisPlan, error) {
	field := func(f string) string { return fmt.Sprintf("Plans[%q].%s", name, f) }
	layers := pl.Layers
	switch {
	case pl.Rule != nil && len(layers) > 0:
		return nil, &ratelimit.RuleError{Rule: "PlanSet", Field: field("Rule"), Reason: "is set as well as Layers"}
	case pl.Rule == nil && len(layers) == 0:
		return nil, &ratelimit.RuleError{Rule: "PlanSet", Field: field("Rule"), Reason: "is nil and there are no Layers"}
	case pl.Rule != nil:
		layers = []ratelimit.Layer{{Rule: pl.Rule}}
	}
	rp := &redisPlan{name: name, counts: pl.Rule != nil}
	doc := planJSON{Plan: name}
	opts := []Option{WithPrefix(p.r.o.prefix), WithClock(p.r.o.clock), WithExpiryMargin(p.r.o.margin), WithDenyCache(p.r.o.denyCache)}
	for i, l := range layers {
		if l.Rule == nil {
			return nil, &ratelimit.RuleError{Rule: "PlanSet", Field: field(fmt.Sprintf("Layers[%d].Rule", i)), Reason: "is nil"}
		}
		rule, err := json.Marshal(ratelimit.RuleSpec{Rule: l.Rule})
		if err != nil {
			return nil, fmt.Errorf("redisstore: plan %q, layer %d: %w", name, i, err)
		}
		doc.Rules = append(doc.Rules, rule)
		rp.heads = append(rp.heads, p.r.o.prefix+"P"+shortHash(name+"\x00"+strconv.Itoa(i)+"\x00"+string(rule))+":")
		rp.keyFns = append(rp.keyFns, l.Key)
		rp.own = rp.own || l.Key == nil
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	rp.json = string(b)
	if len(layers) == 1 && layers[0].Key == nil && !layers[0].Shadow {
		s, err := New(p.r.rdb, layers[0].Rule, opts...)
		if err != nil {
			return nil, fmt.Errorf("redisstore: plan %q: %w", name, err)
		}
		rp.single = s
		return rp, nil
	}
	cl := make([]Layer, len(layers))
	for i, l := range layers {
		cl[i] = Layer{Layer: l}
	}
	c, err := NewComposite(p.r.rdb, cl, append(opts, WithHashTag(p.r.o.hashTag))...)
	if err != nil {
		return nil, fmt.Errorf("redisstore: plan %q: %w", name, err)
	}
	rp.comp = c
	return rp, nil
}

// machine returns layer i's Machine.
func (rp *redisPlan) machine(i int) *ratelimit.Machine {
	if rp.single != nil {
		return rp.single.m
	}
	return rp.comp.lm.Machine(i)
}

// takes reports whether layer i takes part in a request of cost.
func (rp *redisPlan) takes(i int, cost ratelimit.Units) bool {
	return rp.single != nil || rp.comp.lm.Takes(i, cost)
}

// costError is the plan's Decision and error for a cost it refuses as a
// caller's mistake, or nil.
func (rp *redisPlan) costError(cost ratelimit.Units) (ratelimit.Decision, error) {
	if rp.single != nil {
		d, _, err := rp.single.m.Step(nil, 0, cost, false)
		return d, err
	}
	d, _, _, err := rp.comp.lm.Step(make([][]byte, rp.comp.lm.Len()), 0, cost, false)
	return d, err
}

// refused is the Decision that admits nothing.
func (rp *redisPlan) refused() ratelimit.Decision {
	if rp.single != nil {
		return rp.single.refused()
	}
	return rp.comp.refused()
}

// fill names the plan as the Policy of a Decision from a rule without a
// Name, as the in-process Plans does.
func (rp *redisPlan) fill(d ratelimit.Decision) ratelimit.Decision {
	if d.Policy == "" {
		d.Policy = rp.name
	}
	return d
}

// plan returns key's plan in g: the plan ctx names, else the plan
// function's; the default if that is not a plan of g.
func (p *Plans) plan(ctx context.Context, g *plansGen, key string) *redisPlan {
	name, named := ratelimit.PlanFromContext(ctx)
	if !named {
		if p.planOf == nil {
			return g.def
		}
		name = p.planOf(key)
	}
	if rp, ok := g.plans[name]; ok {
		return rp
	}
	return g.def
}

// keyName is the Redis key of key under head: head, then (with a hash tag
// function) a hash of key and ':', and in braces the Cluster hash tag, a
// hash of key or of its tag. A plan's layer keys and its record are named
// alike, so that they share a slot wherever their keys share a tag.
func (p *Plans) keyName(head, key string) (name, tag string) {
	return taggedKey(head, key, p.r.o.hashTag)
}

// RecordKey returns the Redis key of key's record.
func (p *Plans) RecordKey(key string) string {
	k, _ := p.keyName(p.r.o.prefix+"R:", key)
	return k
}

// Keys returns the Redis keys that hold key's state under the plan named
// plan (the default plan if there is none of that name), in layer order.
func (p *Plans) Keys(plan, key string) []string {
	g := p.gen.Load()
	rp, ok := g.plans[plan]
	if !ok {
		rp = g.def
	}
	keys, _, _ := p.planKeys(rp, key, 0)
	return keys
}

// planKeys returns rp's keys for key, and its record's first line. On a
// cluster client, the keys of the layers that take part in a request of
// cost (all of them, for cost 0) must share the record's slot, else the
// error matches [ErrCrossSlot].
func (p *Plans) planKeys(rp *redisPlan, key string, cost ratelimit.Units) ([]string, string, error) {
	keys := make([]string, len(rp.heads))
	_, recTag := p.keyName("", key)
	for i, h := range rp.heads {
		var tag string
		keys[i], tag = p.keyName(h, layerKeyOf(rp.keyFns[i], key))
		if p.cluster && !p.oneSlot && tag != recTag && (cost == 0 || rp.takes(i, cost)) {
			return keys, "", fmt.Errorf("%w: key %q: layer %d's key %s is not in the slot of the key's record", ErrCrossSlot, clipKey(key), i, keys[i])
		}
	}
	return keys, strings.Join(keys, " "), nil
}

func layerKeyOf(fn func(string) string, key string) string {
	if fn != nil {
		return fn(key)
	}
	return key
}

// Check is CheckContext with a background context.
func (p *Plans) Check(key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	return p.CheckContext(context.Background(), key, cost)
}

// CheckContext checks cost for key on its plan, as
// [ratelimit.Plans.CheckContext] does, moving the key first if its record
// names another plan or rule. ctx bounds the whole check, a move included;
// without a deadline, the timeout does. It returns ctx's error, spending
// nothing, if ctx has already ended. Cost errors are the plan's and reach
// no server. Every error but a cost error matches [ratelimit.ErrDegraded]:
// the Decision returned with it is the one to act on.
func (p *Plans) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	g := p.gen.Load()
	return p.check(ctx, g, p.plan(ctx, g, key), key, cost, checkMode{counts: true})
}

// checkMode is how a check of a Plans asks.
type checkMode struct {
	// wait says the check is an attempt of Wait, which the deny cache
	// does not answer.
	wait bool
	// counts says a refusal that a plan of one Rule counts is spent, as a
	// Check spends it (see looks); CheckWithin, CheckLayers and Wait's
	// attempts spend none, as in process.
	counts bool
	// out, if not nil, gets the Decision of every enforced layer of a plan
	// of layers appended (see CheckLayers); a check bounded on its Delay
	// (see Plans.within) appends a plan of one rule's too.
	out *[]ratelimit.Decision
}

// check is CheckContext of key on its plan rp of rule set g, asking as
// mode says.
func (p *Plans) check(ctx context.Context, g *plansGen, rp *redisPlan, key string, cost ratelimit.Units, mode checkMode) (ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return rp.fill(rp.refused()), err
	}
	d, err := p.decide(ctx, g, rp, key, cost, mode)
	d = rp.fill(d)
	err = degradedError(err)
	observe(p.r.o.observer, d.Policy, d, cost, err)
	return d, err
}

// maxMoves is how many times a check tries to move a key that other checks
// keep changing before it refuses with [ErrUnavailable].
const maxMoves = 16

// decide is CheckContext's check of key on plan rp; a wait's (see check)
// is not answered by the deny cache.
func (p *Plans) decide(ctx context.Context, g *plansGen, rp *redisPlan, key string, cost ratelimit.Units, mode checkMode) (ratelimit.Decision, error) {
	if d, err := rp.costError(cost); err != nil {
		return d, err
	}
	keys, line, err := p.planKeys(rp, key, cost)
	if err != nil {
		return rp.refused(), err
	}
	// A plan of one rule has its Store's deny cache: a refusal Redis made
	// on the plan's key is repeated without a round trip while the state
	// it read refuses (see WithDenyCache).
	var floor int64
	var gen uint64
	deny := rp.deny()
	if deny != nil {
		gen = deny.generation()
		if mode.wait {
			// Wait's checks go to Redis (see Store.Wait).
			floor = deny.floor(keys[0])
		} else {
			d, ok, latest := deny.answer(rp.single.judge, p.r.o.clock, keys[0], cost)
			if ok {
				rp.single.localDenials.Add(1)
				return d, nil
			}
			floor = latest
		}
	}
	look := rp.looks(mode.counts)
	ctx, cancel := p.r.bounded(ctx)
	defer cancel()
	reply, sent, err := p.run(ctx, g, rp, key, keys, line, planOp{kind: rp.kind(), cost: cost, floor: floor, args: func(now string) []any {
		return p.checkArgs(rp, now, cost, look, maxBudget)
	}})
	var ce *callError
	switch {
	case errors.As(err, &ce):
		return p.failed(ctx, rp, key, cost, maxBudget, ce.err)
	case err != nil:
		return rp.refused(), err
	}
	return p.verified(rp, key, keys[0], cost, reply, look, deny, gen, sent, mode.out)
}

// planOp is an operation of a Plans on a key's plan: plans.lua's ARGV[2]
// (kind), the cost whose layers take part, which decides which layers a
// move moves, the latest instant the plan used for the key without telling
// Redis (see Store.args), and the operation's arguments at the instant now
// (empty for the server's TIME).
type planOp struct {
	kind  string
	cost  ratelimit.Units
	floor int64
	args  func(now string) []any
	// keeps is true for an operation that adds no key to Redis (a refund,
	// a peek): a move of its key that takes nothing leaves the key's
	// record as it is, as in process.
	keeps bool
}

// callError is a script call's error, which a Plans' operation answers
// with its failure policy (see Plans.failed).
type callError struct{ err error }

func (e *callError) Error() string { return e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

// run runs op on key's plan rp of g, whose keys are keys (line, the
// record's first line): in one script call if the key's record names
// rp's keys or there is none; else the script returns the record and the
// states, the move is computed in Go (see move), and a second call writes
// it and runs op, starting over if another check moved the key first. It
// returns op's reply and when the call that made it was sent. An error of
// a call is a *callError; a record or state that cannot be moved, an
// error matching [ratelimit.ErrInvalidState] (counted).
func (p *Plans) run(ctx context.Context, g *plansGen, rp *redisPlan, key string, keys []string, line string, op planOp) ([]any, time.Time, error) {
	id := line + "\n" + rp.json
	all := append([]string{p.RecordKey(key)}, keys...)
	for range maxMoves {
		now := ""
		if t, ok := p.r.now(); ok {
			now = strconv.FormatInt(max(t, op.floor), 10)
		}
		opArgs := op.args(now)
		args := append([]any{"c", op.kind, id, strconv.Itoa(len(keys)), p.r.o.prefix, now, "8"}, opArgs...)
		sent := time.Now()
		reply, err := p.call(ctx, all, args)
		if err != nil {
			return nil, sent, &callError{err}
		}
		if tag, _ := reply[0].(string); tag == "c" {
			return reply[1:], sent, nil
		}
		mv, err := p.move(g, rp, key, keys, id, reply, op.cost, !op.keeps)
		if err != nil {
			p.r.invalid.Add(1)
			return nil, sent, fmt.Errorf("%w: key %q: %w", ratelimit.ErrInvalidState, clipKey(key), err)
		}
		args = append([]any{"m", op.kind, id, strconv.Itoa(len(keys)), p.r.o.prefix, now, strconv.Itoa(12 + len(mv.args))}, mv.head...)
		args = append(append(args, mv.args...), opArgs...)
		sent = time.Now()
		reply, err = p.call(ctx, append(all[:1+len(keys):1+len(keys)], mv.old...), args)
		if err != nil {
			return nil, sent, &callError{err}
		}
		if tag, _ := reply[0].(string); tag == "c" {
			if mv.moves {
				p.moves.Add(1)
			}
			return reply[1:], sent, nil
		}
		p.conflicts.Add(1)
	}
	// Not Redis failing but checks racing: refused, whatever the policy,
	// since failing open would admit past the limit the racing checks
	// enforce.
	return nil, time.Time{}, fmt.Errorf("%w: key %q: moved by other checks %d times in a row", ErrUnavailable, clipKey(key), maxMoves)
}

// kind is plans.lua's ARGV[2] for the plan.
func (rp *redisPlan) kind() string {
	if rp.single != nil {
		return "s"
	}
	return "l"
}

// looks reports whether a check of a plan of one rule is a look (see
// Store.args), which spends no refusal: as in process, a refusal under
// CountRefused is spent by a Check (counts) of a plan of one Rule, as a
// Store's Check spends it, but neither by a Wait's attempt, a CheckWithin
// or a CheckLayers, nor by a plan of layers (of one layer here), as a
// Composite spends none.
func (rp *redisPlan) looks(counts bool) bool {
	return rp.single != nil && rp.single.p.CountRefused && !(counts && rp.counts)
}

// checkArgs are the arguments of the plan's check at now (empty for
// the server's TIME); look as rp.looks says. A budget other than
// maxBudget bounds the Delay of a plan whose admissions may carry one (see
// redisPlan.delays), as the Store's and the Composite's CheckWithin bound
// it.
func (p *Plans) checkArgs(rp *redisPlan, now string, cost ratelimit.Units, look bool, budget time.Duration) []any {
	bounded := budget != maxBudget
	if rp.single != nil {
		args := rp.single.args(cost, 0, look)
		args[argNow.at] = now
		if bounded {
			args = appendBound(args, rp.single.p, budget)
		}
		return args
	}
	return rp.comp.boundedArgs(now, cost, bounded, budget)
}

// call runs the script, through the circuit of the key's master.
func (p *Plans) call(ctx context.Context, keys []string, args []any) ([]any, error) {
	reply, err := p.r.call(ctx, plansScript, keys, args...)
	if err == nil && len(reply) == 0 {
		err = fmt.Errorf("%w: empty reply", ErrMismatch)
	}
	return reply, err
}

// failed answers a check whose script call failed: a corrupted record or
// state, or keys in different slots, refuse; Redis failing is the failure
// policy's.
// A request that may wait at most maxDelay (maxBudget: any time) asks a
// fallback as [Store.CheckWithinContext] asks it.
func (p *Plans) failed(ctx context.Context, rp *redisPlan, key string, cost ratelimit.Units, maxDelay time.Duration, err error) (ratelimit.Decision, error) {
	if err, ok := p.unanswered(key, err); ok {
		return rp.refused(), err
	}
	return p.degraded(ctx, rp, key, cost, maxDelay, err)
}

// unanswered returns, with ok true, the error of a script call for key
// that no failure policy answers: a corrupted record or state (counted),
// keys in different slots, a reply not understood; ok is false for Redis
// failing, and err is returned as it is.
func (p *Plans) unanswered(key string, err error) (error, bool) {
	switch {
	case isStateError(err):
		// plans.lua reads the keys a record names with pcall: a Cluster
		// node's refusal of one in another slot is such an error too.
		p.r.invalid.Add(1)
		return fmt.Errorf("%w: key %q: %v", ratelimit.ErrInvalidState, clipKey(key), err), true
	case isCrossSlot(err):
		return fmt.Errorf("%w: key %q: %v", ErrCrossSlot, clipKey(key), err), true
	case errors.Is(err, ErrMismatch):
		return err, true
	}
	return err, false
}

// verified turns the check's reply, to a call sent at sent, into the
// Decision, as the plan's Store or Composite does, and tells the deny
// cache, if any, of the key's refusal or admission. out, if not nil, gets
// the Decision of every enforced layer of a plan of layers appended.
func (p *Plans) verified(rp *redisPlan, key, rk string, cost ratelimit.Units, reply []any, look bool, deny *denyCache, gen uint64, sent time.Time, out *[]ratelimit.Decision) (ratelimit.Decision, error) {
	if rp.single == nil {
		v, err := rp.comp.verify(key, cost, reply, out)
		return v.d, err
	}
	d, at, state, err := rp.single.verify(key, cost, reply, look)
	if deny != nil && err == nil {
		if d.Allowed {
			deny.forget(rk)
		} else {
			deny.remember(rk, [][]byte{[]byte(state)}, at, sent, time.Now(), gen)
		}
	}
	return d, err
}

// deny is the deny cache of a plan of one rule, nil if none.
func (rp *redisPlan) deny() *denyCache {
	if rp.single == nil {
		return nil
	}
	return rp.single.deny
}

// degraded applies the failure policy to a check Redis did not decide,
// of a request that may wait at most maxDelay (maxBudget: any time).
func (p *Plans) degraded(ctx context.Context, rp *redisPlan, key string, cost ratelimit.Units, maxDelay time.Duration, cause error) (ratelimit.Decision, error) {
	if d, err, ok := fallBack(ctx, p.r.o.fallback, key, cost, maxDelay, cause); ok {
		return d, err
	}
	return p.failureMode(rp)(cost), cause
}

// failureMode returns the failure mode's Decision for a request of cost
// on plan rp that Redis did not decide.
func (p *Plans) failureMode(rp *redisPlan) func(cost ratelimit.Units) ratelimit.Decision {
	return func(cost ratelimit.Units) ratelimit.Decision {
		if p.r.o.mode == FailClosed {
			d := rp.refused()
			d.RetryAfter = p.r.o.pause
			return d
		}
		// As if the key were fresh: what losing its state would give.
		now := time.Duration(clamp(p.r.clock().Now()))
		if rp.single != nil {
			d, _, _ := rp.single.m.Step(nil, now, cost, false)
			return d
		}
		d, _, _, _ := rp.comp.lm.Step(make([][]byte, rp.comp.lm.Len()), now, cost, false)
		return d
	}
}

// plannedMove is what the move script writes: its arguments after the
// first seven (head: the record as read and to write, its expiry, the
// number of old keys; args: each key's state as read and what to do with
// it) and the old keys it reads.
type plannedMove struct {
	head  []any
	args  []any
	old   []string
	moves bool // false: the record stays, and nothing is written
}

// move computes the move of key, whose record names other keys than plan
// rp's (keys), from the script's reply: {'m', now, record, k, the states
// of the k keys it names, the states of rp's keys}. The record's plan is
// read from the record itself, so that a replica on another rule set
// moves it alike.
func (p *Plans) move(g *plansGen, rp *redisPlan, key string, keys []string, id string, reply []any, cost ratelimit.Units, adds bool) (plannedMove, error) {
	var mv plannedMove
	if len(reply) < 4 {
		return mv, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
	}
	nowS, _ := reply[1].(string)
	rec, ok := reply[2].(string)
	k, ok2 := reply[3].(int64)
	now, err := strconv.ParseInt(nowS, 10, 64)
	if !ok || !ok2 || err != nil || k < 1 || len(reply) != 4+int(k)+len(keys) {
		return mv, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
	}
	states := make([]string, 0, int(k)+len(keys))
	for _, v := range reply[4:] {
		s, ok := v.(string)
		if !ok {
			return mv, fmt.Errorf("%w: unexpected reply %v", ErrMismatch, reply)
		}
		states = append(states, s)
	}
	olds, news := states[:k], states[k:]
	from, carry, err := p.known.parse(rec, int(k))
	if err != nil {
		return mv, err
	}
	policy := g.set.OnMove
	if from.name == rp.name {
		var known bool
		if policy, known = g.replaced[from.json]; !known {
			// Rules of the plan this replica never ran (another replica's,
			// during a rolling reload): back by the policy the key was
			// moved in with, so that moving back and forth takes nothing
			// one way that the other gives back, but never by a reset.
			policy = g.last
			if from.movedIn {
				policy = from.moved
			}
			if policy == ratelimit.MigrateReset {
				policy = ratelimit.MigrateProportional
			}
		}
	}
	// As in process, a key whose layers that take part in this check all
	// hold a state already is not moved, and its record stays as it is
	// (a layer that sits a check out moves at a check it takes part in).
	lacking := false
	for i := range keys {
		if !rp.takes(i, cost) {
			continue
		}
		if news[i] == "" {
			lacking = true
		} else if g.shared {
			// A state that holds nothing spent says nothing of whether
			// the key moved in (a layer with a Key shares it), as in
			// process (see lacking there).
			fresh, err := rp.machine(i).Fresh([]byte(news[i]), time.Duration(now))
			if err != nil {
				return mv, err
			}
			lacking = lacking || fresh
		}
	}
	// stay leaves the record as it is, and writes nothing.
	stay := func() (plannedMove, error) {
		mv := plannedMove{head: []any{rec, rec, "", "0"}}
		for i := range keys {
			mv.args = append(mv.args, news[i], "", "")
		}
		return mv, nil
	}
	if !lacking {
		return stay()
	}
	mv.moves = true
	took := false // a layer took the key's state from a key that held one
	record := []byte(nil)
	recMs := p.marginMs
	writes := make([]string, len(keys))
	ms := make([]int64, len(keys))
	del := make([]bool, len(from.keys))
	for i := range keys {
		if i >= len(from.keys) || from.keys[i] == keys[i] || (olds[i] == "" && i > 0) || !rp.takes(i, cost) {
			continue
		}
		if !p.movesLayer(from, rp, i, key) {
			continue // a shared layer's state stays where it is (see movesLayer)
		}
		if news[i] != "" {
			// The plan's key already holds a state: the key moves into it
			// only if that is as good as a fresh one, as in process.
			fresh, err := rp.machine(i).Fresh([]byte(news[i]), time.Duration(now))
			if err != nil {
				return mv, err
			}
			if !fresh {
				continue
			}
		}
		var c []byte
		if i == 0 {
			c = carry
		}
		m, err := ratelimit.MoveState(from.machines[i], rp.machine(i), policy, []byte(olds[i]), c, time.Duration(now))
		if err != nil {
			return mv, err
		}
		del[i] = true
		if olds[i] != "" && !took {
			// Only a state that holds something spent is taken, as in
			// process: an operation that adds no key and finds only states
			// as good as fresh leaves the record as it is.
			fresh, err := from.machines[i].Fresh([]byte(olds[i]), time.Duration(now))
			if err != nil {
				return mv, err
			}
			took = !fresh
		}
		if len(m.State) > 0 {
			writes[i] = string(m.State)
			ms[i] = ceilMs(m.Whole-m.At) + p.marginMs
			recMs = max(recMs, ms[i])
		}
		if i == 0 && len(m.Record) > 0 {
			record = m.Record
			if until, err := strconv.ParseInt(strings.Fields(string(m.Record))[1], 10, 64); err == nil {
				recMs = max(recMs, ceilMs(time.Duration(until)-m.At)+p.marginMs)
			}
		}
	}
	if !adds && !took {
		// As in process, an operation that adds no key (a refund, a peek)
		// and moved nothing leaves the record naming where the key was.
		return stay()
	}
	// As in process, a move onto a plan with no layer of the key's own
	// (every layer has a Key) keeps the record naming the keys that hold
	// the key's own state, for its next move, or a Reset, to find them.
	newRec := rec
	if rp.own || !p.ownsAny(from, key) {
		newRec = id + "\n" + strconv.Itoa(int(policy))
		if len(record) > 0 {
			newRec += " " + string(record)
		}
	}
	mv.head = []any{rec, newRec, strconv.FormatInt(recMs, 10), ""}
	for i := range keys {
		px := ""
		if writes[i] != "" {
			px = strconv.FormatInt(ms[i], 10)
		}
		mv.args = append(mv.args, news[i], writes[i], px)
	}
	inPlan := make(map[string]bool, len(keys))
	for _, key := range keys {
		inPlan[key] = true
	}
	for j, key := range from.keys {
		if inPlan[key] {
			continue
		}
		flag := ""
		if del[j] {
			flag = "1"
		}
		mv.old = append(mv.old, key)
		mv.args = append(mv.args, olds[j], flag)
	}
	mv.head[3] = strconv.Itoa(len(mv.old))
	return mv, nil
}

// movesLayer reports whether key's move from plan from (as its record
// names it) to plan rp takes layer i's state along, as the in-process Plans
// decides it: a layer with a Key holds a state its plan's keys share, which
// stays where it is when one of them moves to another plan, and moves,
// once and whole, only to the rule an Update replaces its rule with. The
// record names keys, not key functions: the old layer is shared if its key
// is not the one the key itself has under that layer's head.
func (p *Plans) movesLayer(from recordedPlan, rp *redisPlan, i int, key string) bool {
	old, n := from.keys[i], headLen(p.r.o.prefix)
	if len(old) > n && old[:n] == rp.heads[i] {
		return false // the same rule: what the layer holds stays, as in process
	}
	fromShared := !p.ownKey(old, key)
	toShared := rp.keyFns[i] != nil
	if !fromShared || !toShared {
		return !fromShared && !toShared
	}
	return from.name == rp.name
}

// headLen is the length of a plan's layer's key head under prefix (see
// buildPlan).
func headLen(prefix string) int { return len(prefix) + len("P") + 8 + len(":") }

// ownKey reports whether old, a key a record names, is key's own under its
// layer's head (a layer without a Key), not one a layer with a Key shares.
func (p *Plans) ownKey(old, key string) bool {
	n := headLen(p.r.o.prefix)
	if len(old) <= n {
		return false
	}
	own, _ := p.keyName(old[:n], key)
	return old == own
}

// ownsAny reports whether a key that from (as key's record names it) names
// is key's own.
func (p *Plans) ownsAny(from recordedPlan, key string) bool {
	for _, old := range from.keys {
		if p.ownKey(old, key) {
			return true
		}
	}
	return false
}

// recordedPlan is a plan as a record names it: its keys for the key, its
// name, JSON and rules' Machines, and the policy the key was moved onto it
// with, if it was moved there (movedIn).
type recordedPlan struct {
	name     string
	json     string
	keys     []string
	machines []*ratelimit.Machine
	moved    ratelimit.Migration
	movedIn  bool
}

// recordedPlans caches the plans records name, by their JSON: a plan's
// Machines are built once per replica, not per move.
type recordedPlans struct {
	mu sync.Mutex
	m  map[string]*recordedPlan
}

// parse reads a record that names k keys: its plan, and its move record.
func (r *recordedPlans) parse(rec string, k int) (recordedPlan, []byte, error) {
	lines := strings.Split(rec, "\n")
	if len(lines) != 3 {
		return recordedPlan{}, nil, errors.New("redisstore: a plan's record is not three lines")
	}
	keys := strings.Split(lines[0], " ")
	if len(keys) != k {
		return recordedPlan{}, nil, errors.New("redisstore: a plan's record names keys that are not well formed")
	}
	r.mu.Lock()
	pl, ok := r.m[lines[1]]
	r.mu.Unlock()
	if !ok {
		var doc planJSON
		if err := json.Unmarshal([]byte(lines[1]), &doc); err != nil {
			return recordedPlan{}, nil, fmt.Errorf("redisstore: a plan's record: %w", err)
		}
		pl = &recordedPlan{name: doc.Plan, json: lines[1]}
		for _, raw := range doc.Rules {
			var spec ratelimit.RuleSpec
			if err := json.Unmarshal(raw, &spec); err != nil {
				return recordedPlan{}, nil, fmt.Errorf("redisstore: a plan's record: %w", err)
			}
			m, err := ratelimit.NewMachine(spec.Rule)
			if err != nil {
				return recordedPlan{}, nil, fmt.Errorf("redisstore: a plan's record: %w", err)
			}
			pl.machines = append(pl.machines, m)
		}
		r.mu.Lock()
		if r.m == nil || len(r.m) >= 256 {
			r.m = map[string]*recordedPlan{}
		}
		r.m[lines[1]] = pl
		r.mu.Unlock()
	}
	if len(pl.machines) != k {
		return recordedPlan{}, nil, errors.New("redisstore: a plan's record names a key per rule, not as many")
	}
	out := *pl
	out.keys = keys
	last := lines[2]
	if last == "" {
		return out, nil, nil
	}
	policy, carry, _ := strings.Cut(last, " ")
	if len(policy) != 1 || policy[0] < '0' || policy[0] > '0'+byte(ratelimit.MigrateReset) {
		return recordedPlan{}, nil, errors.New("redisstore: a plan's record names no migration policy")
	}
	out.moved, out.movedIn = ratelimit.Migration(policy[0]-'0'), true
	return out, []byte(carry), nil
}

// The plans' script (plans.lua) runs the single-key step (step.lua's
// script), the layers' step (layers.lua's), the refunds and settlements
// (settle.lua's) or the reads and resets (ops.lua's) as functions of their
// own, whose KEYS, ARGV and redis are its parameters.
//
//go:embed plans.lua
var plansLua string

var (
	plansSource = "local function single(KEYS, ARGV, redis)\n" + stepSource +
		"\nend\nlocal function layered(KEYS, ARGV, redis)\n" + layersScriptSource +
		"\nend\nlocal function settled(KEYS, ARGV, redis)\n" + settleSource +
		"\nend\nlocal function ops(KEYS, ARGV, redis)\n" + opsLua + "\nend\n" + plansLua
	plansScript = redis.NewScript(plansSource)
)

var (
	_ ratelimit.ContextChecker = (*Plans)(nil)
	_ ratelimit.KeyedLimiter   = (*Plans)(nil)
)
