package ratelimit

import (
	"context"
	"fmt"
	"hash/maphash"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Plan is one plan of a [PlanSet]: the limit every key on it is held to.
// Exactly one of Rule and Layers is set.
type Plan struct {
	// Rule is the plan's one rule.
	Rule Rule

	// Layers, instead of Rule, make the plan several limits that every
	// request must pass together, as [Compose] does, with the same
	// Decisions. Each layer's Options apply to its store, after those given
	// to [NewPlans].
	Layers []Layer
}

// PlanSet is a rule set: named plans, and the plan of keys that have none.
// It is a plain value: [NewPlans] and [Plans.Update] validate it and keep
// what they built from it, so changing it afterwards affects nothing. It
// reads from and writes to a JSON document (see [PlanSet.MarshalJSON]).
type PlanSet struct {
	// Plans are the plans by name. At least one is needed.
	Plans map[string]Plan

	// Default names the plan of a key whose plan function returns a name
	// that is not in Plans (such as "" for a key it does not know).
	Default string

	// OnMove is what a key keeps when it moves to another plan (its plan
	// function now names another): [MigrateProportional] unless set.
	OnMove Migration
}

// Plans is a keyed limiter that picks each key's rule at check time: a
// [PlanSet] of named plans, and a function from key to plan name (an API
// key looked up in a customer table, say). Its rules can be changed while
// it runs, with [Plans.Update], without a restart and without handing
// every key a fresh allowance.
//
// A key is held in one place at a time: the store of its plan (its layer
// stores, for a plan of layers), at the memory per key that store costs
// (see [Store]). When a key's plan changes (its plan function names
// another), or its plan's rule is changed by an Update, the key's state
// moves to its new store the next time it is checked, converted by a
// [Migration] policy; there is no pass over all keys. A layer with a Key
// (a global or a per-customer limit) holds state its plan's keys share: it
// stays with the plan when one key moves to another (see [Migration]); a
// key that moves onto a plan whose every layer has a Key leaves its own
// state, and its record, with the plan it came from.
// Which plan holds a key is kept in a record of the key (16 bytes besides
// the key, and 48 more for a key whose last move carried an amount in;
// in tables of the rule set's own, bounded as a store is, with room for as
// many keys as all the plans' stores when it is built, which grow by half
// their size at a time rather than a store's eighth: more slack per
// record, for a record's insertion that copies and allocates less than
// the insertion of the key's state in its store), so that a key
// checked for the first time, or the first time since it moved, takes the
// locks of its record and of the stores of two plans, whatever the number
// of plans and of rule sets an Update replaced. A key held in its plan's stores is
// checked without its record. The stores an Update replaced are kept until
// every key in them would be as good as fresh (two of their windows, or
// longer while what moves carried into them is being given back), and
// at most the last 64 of them: a key last checked under a plan replaced
// longer ago than that starts fresh in the layers whose rule changed. A
// record dropped to make room (the least recently moved first) loses only
// where an earlier state of its key is: like a store's lossy eviction, the
// key then starts fresh under a plan it moves to; and what its last move
// carried in, dropped to make room, loses only what of it the key's state
// no longer shows.
//
// Check, CheckContext, CheckWithin and Wait behave as a [Composite]'s over
// the key's plan (a [Store]'s, for a plan of one rule), except that a
// Decision from a rule without a Name reports the plan's name as its
// Policy, so that an HTTP response names the client's plan. Every check sees
// either the rule set before an Update or the one after it, never a mix.
// Plans is safe for concurrent use, starts no goroutines and needs no
// Close. The zero Plans is not usable; build one with [NewPlans].
type Plans struct {
	records planRecords // where each key's state is held (see planRecord)
	planOf  func(key string) string
	warn    *planWarning
	clock   Clock
	obs     Observer // nil: none
	opts    []Option
	seed    maphash.Seed // of every store, and of records (see options.seed)
	update  sync.RWMutex // serialises Update; held for reading by a fenced attempt (see fence)
	gen     atomic.Pointer[planGen]
}

// planGen is one rule set as built: the plans, and the stores of earlier
// rule sets that may still hold keys.
type planGen struct {
	set    PlanSet
	plans  map[string]*builtPlan
	def    *builtPlan
	names  []string     // the plans' names, sorted
	byName []*builtPlan // the plans in the order of names
	// byID finds a plan by its id, for the plan a key's record names: this
	// set's plans, and the plans of earlier sets whose stores may still
	// hold keys (see replacedPlan).
	byID map[uint64]*recordedPlan
	// byLineage finds this set's plan of a lineage (see builtPlan), for a
	// record whose plan is no longer in byID.
	byLineage map[uint64]*recordedPlan
	// replaced are the plans of earlier sets in byID, newest first.
	replaced []*recordedPlan
	// shared is whether a plan of the set, or of a set before it, has a
	// layer with a Key: a key's move may then have left an entry where the
	// key's record no longer points (see lacking).
	shared bool
	// done ends when a later Update replaces this set, to wake waiters.
	done   context.Context
	cancel context.CancelFunc
}

// builtPlan is a plan as built: a composite of its layers.
type builtPlan struct {
	id uint64 // unique among the plans a Plans ever built
	// single is the plan's one store, for a plan of one rule (no layer Key
	// or Shadow): the check of a key it holds needs nothing else.
	single keyedStore
	// counts is whether a check counts a refusal, as a Store's Check does:
	// for a plan of one Rule (not of Layers) that counts refusals.
	counts bool
	// lineage is the same for a plan and the plans that replace it under
	// the same name, so that a key last checked under a plan since retired
	// is looked for in the stores its successor kept.
	lineage uint64
	name    planName
	comp    Composite
	// rules are the layers' rules, dereferenced, to tell which stores an
	// Update can keep.
	rules []Rule
	// own is whether a layer of the plan is the key's own (has no Key): a
	// key's move onto a plan without one keeps its record (see lockPlan).
	own bool
	// carried is the latest instant until which a move into the plan
	// carried an amount in (see moveRecord): an Update that replaces the
	// plan keeps its stores at least that long, so that the keys' records
	// still find the states they carry into.
	carried atomic.Int64
}

// planName is a plan's name, which a Decision from a rule without a Name
// reports as its Policy.
type planName string

func (n planName) fill(d *Decision) {
	if d.Policy == "" {
		d.Policy = string(n)
	}
}

// recordedPlan is a plan a key's record may name: a plan of the set in
// force, or one an Update replaced, with the policy of that Update and the
// instant after which every key its replaced stores hold is fresh.
type recordedPlan struct {
	bp     *builtPlan
	policy Migration // replaced: the policy of the Update that replaced it
	until  int64     // replaced: every key in its stores is fresh after this
}

// maxReplaced bounds how many replaced plans a rule set keeps: a key last
// checked under a plan more Updates ago than that (within two of its
// windows) starts fresh under its new plan (see Plans.Update).
const maxReplaced = 64

// NewPlans validates set and builds a [Plans] over it. planOf returns the
// plan name of a key; it must be safe for concurrent use and quick (it runs
// on every check, outside any lock, and must not call the Plans' Update).
// A nil planOf puts every key on the default plan. opts apply to every
// plan's stores: [WithClock] (one clock for all), [WithMaxKeys] and
// [WithShards] (per store), and [WithPreallocation] (per store, and for
// the table of key records, whose bound is that of all the plans' stores
// together). A malformed rule is an
// error matching [ErrInvalidRule], naming the plan.
//
// A plan function that names no plan of the set for 256 distinct keys,
// having named none so far, is reported once, as a warning to the logger
// of [WithLogger] (by default slog.Default; nil silences it): the usual
// cause is keys that reach it in another form than the one it looks
// customers up by (an HTTP middleware that keys by a hash of the API key),
// which puts every paying customer on the default plan. One plan named for
// one key ends the watch, and after it a check pays one atomic load.
func NewPlans(set PlanSet, planOf func(key string) string, opts ...Option) (*Plans, error) {
	o := buildOptions(opts)
	p := &Plans{planOf: planOf, clock: o.clock, obs: o.obs, opts: opts, warn: newPlanWarning(o), seed: maphash.MakeSeed()}
	g, err := p.build(set, nil, 0, MigrateProportional)
	if err != nil {
		return nil, err
	}
	maxKeys, shards, _ := storeShape(o.store) // build validated the options
	p.records.init(p.seed, min(maxStoreKeys, maxKeys*len(g.plans)), shards, o.store.prealloc)
	p.gen.Store(g)
	return p, nil
}

// Update replaces the rule set with set, atomically: every check after
// Update returns sees set, and none sees a mix. Keys whose plan's rule
// changed keep what m says (see [Migration]) when next checked; keys of
// plans whose rule is the same keep their state as it is. Goroutines
// blocked in Wait wake and retime themselves against the new rules. A set
// that does not validate is refused whole, and the rules in force stay as
// they were. Update may be called from any goroutine while checks run.
func (p *Plans) Update(set PlanSet, m Migration) error {
	if !m.valid() {
		return fmt.Errorf("%w: Update: %v is not a migration policy", ErrInvalidOption, m)
	}
	p.update.Lock()
	defer p.update.Unlock()
	return p.replace(set, m)
}

// replace is Update with the update lock held.
func (p *Plans) replace(set PlanSet, m Migration) error {
	old := p.gen.Load()
	g, err := p.build(set, old, clampTime(p.clock.Now()), m)
	if err != nil {
		return err
	}
	p.gen.Store(g)
	old.cancel()
	return nil
}

// Set returns the rule set in force.
func (p *Plans) Set() PlanSet { return p.gen.Load().set.Clone() }

// Stats returns each plan's store counters, in layer order, by plan name.
func (p *Plans) Stats() map[string][]StoreStats {
	g := p.gen.Load()
	st := make(map[string][]StoreStats, len(g.plans))
	for name, bp := range g.plans {
		st[name] = bp.comp.Stats()
	}
	return st
}

// Clock returns the clock every plan reads, and that Wait sleeps on.
func (p *Plans) Clock() Clock { return p.clock }

// Clone returns a copy of set that shares no map or slice with it: a
// backend that keeps a rule set (as [NewPlans] does) keeps its clone, so
// that its caller's later changes to the set affect nothing.
func (set PlanSet) Clone() PlanSet {
	plans := make(map[string]Plan, len(set.Plans))
	for name, pl := range set.Plans {
		pl.Layers = append([]Layer(nil), pl.Layers...)
		plans[name] = pl
	}
	set.Plans = plans
	return set
}

// build validates set and builds its generation, keeping from old the
// stores whose plan and layer keep the same rule.
func (p *Plans) build(set PlanSet, old *planGen, now int64, m Migration) (*planGen, error) {
	set = set.Clone()
	if len(set.Plans) == 0 {
		return nil, &RuleError{Rule: "PlanSet", Field: "Plans", Reason: "is empty"}
	}
	if _, ok := set.Plans[set.Default]; !ok {
		return nil, &RuleError{Rule: "PlanSet", Field: "Default", Reason: fmt.Sprintf("%q is not one of the plans", set.Default)}
	}
	if !set.OnMove.valid() {
		return nil, &RuleError{Rule: "PlanSet", Field: "OnMove", Reason: fmt.Sprintf("%v is not a migration policy", set.OnMove)}
	}
	g := &planGen{set: set, plans: make(map[string]*builtPlan, len(set.Plans))}
	for name := range set.Plans {
		g.names = append(g.names, name)
	}
	sort.Strings(g.names)
	kept := map[keyedStore]bool{}
	for _, name := range g.names {
		bp, err := p.buildPlan(name, set.Plans[name], old)
		if err != nil {
			return nil, err
		}
		for _, l := range bp.comp.layers {
			kept[l.store] = true
		}
		g.plans[name] = bp
		g.byName = append(g.byName, bp)
	}
	g.def = g.plans[set.Default]
	g.byID = make(map[uint64]*recordedPlan, len(g.plans))
	g.byLineage = make(map[uint64]*recordedPlan, len(g.plans))
	for _, bp := range g.plans {
		r := &recordedPlan{bp: bp, policy: m}
		g.byID[bp.id] = r
		g.byLineage[bp.lineage] = r
	}
	if old != nil {
		for _, name := range old.names {
			bp := old.plans[name]
			var until int64 // the latest instant a replaced store's key may be partly spent
			for _, l := range bp.comp.layers {
				if !kept[l.store] {
					until = max(until, addTime(now, 2*l.store.policy().window), bp.carried.Load())
				}
			}
			g.replaced = append(g.replaced, &recordedPlan{bp: bp, policy: m, until: until})
		}
		live := map[keyedStore]bool{} // the stores old's own plans hold keys in
		for _, bp := range old.plans {
			for _, l := range bp.comp.layers {
				live[l.store] = true
			}
		}
		for _, r := range old.replaced {
			// A plan an earlier Update replaced but for stores it kept
			// names those stores in its keys' records: it stays known as
			// long as they are kept; and if this Update replaces them, it
			// replaces that plan as it replaces the plans of old, with m,
			// and its keys are partly spent until two of their windows
			// from now.
			c := *r
			shared := false
			for _, l := range r.bp.comp.layers {
				switch {
				case live[l.store] && kept[l.store]:
					shared = true
				case live[l.store]:
					c.until = max(c.until, addTime(now, 2*l.store.policy().window))
					c.policy = m
				}
			}
			if (shared || c.until > now) && len(g.replaced) < maxReplaced {
				if c != *r {
					r = &c
				}
				g.replaced = append(g.replaced, r)
			}
		}
		for _, r := range g.replaced {
			g.byID[r.bp.id] = r
		}
	}
	g.shared = old != nil && old.shared
	for _, bp := range g.plans {
		for _, l := range bp.comp.layers {
			g.shared = g.shared || l.key != nil
		}
	}
	g.done, g.cancel = context.WithCancel(context.Background())
	return g, nil
}

// buildPlan builds one plan, reusing old's store for every layer whose
// rule is unchanged.
func (p *Plans) buildPlan(name string, pl Plan, old *planGen) (*builtPlan, error) {
	field := func(f string) string { return fmt.Sprintf("Plans[%q].%s", name, f) }
	layers := pl.Layers
	switch {
	case pl.Rule != nil && len(layers) > 0:
		return nil, &RuleError{Rule: "PlanSet", Field: field("Rule"), Reason: "is set as well as Layers"}
	case pl.Rule == nil && len(layers) == 0:
		return nil, &RuleError{Rule: "PlanSet", Field: field("Rule"), Reason: "is nil and there are no Layers"}
	case pl.Rule != nil:
		layers = []Layer{{Rule: pl.Rule}}
	}
	var prev *builtPlan
	if old != nil {
		prev = old.plans[name]
	}
	bp := &builtPlan{id: planIDs.Add(1), name: planName(name), comp: Composite{clock: p.clock, layers: make([]compositeLayer, len(layers))}}
	bp.lineage = bp.id
	if prev != nil {
		bp.lineage = prev.lineage
	}
	for i, l := range layers {
		if isNil(l.Rule) {
			return nil, &RuleError{Rule: "PlanSet", Field: field(fmt.Sprintf("Layers[%d].Rule", i)), Reason: "is nil"}
		}
		rule := deref(l.Rule)
		var store keyedStore
		if prev != nil && i < len(prev.rules) && prev.rules[i] == rule {
			store = prev.comp.layers[i].store
		} else {
			all := append(append(append([]Option(nil), p.opts...), l.Options...), WithClock(p.clock), withLabel(name), withSeed(&p.seed))
			s, err := newKeyedStore(rule, all)
			if err != nil {
				return nil, fmt.Errorf("ratelimit: plan %q, layer %d: %w", name, i, err)
			}
			store = s
		}
		bp.rules = append(bp.rules, rule)
		bp.own = bp.own || l.Key == nil
		bp.comp.layers[i] = compositeLayer{store: store, key: l.Key, shadow: l.Shadow, report: l.OnShadow}
		if !l.Shadow {
			bp.comp.enforced++
		}
	}
	if l := bp.comp.layers; len(l) == 1 && l[0].key == nil && !l[0].shadow {
		bp.single = l[0].store
	}
	if pl.Rule != nil {
		// A plan of one rule is a Store's: its checks count a refusal the
		// rule counts, and its looks report one as counted.
		bp.counts = bp.single.countsRefused()
		bp.comp.layers[0].counts = true
	}
	return bp, nil
}

// planIDs numbers the plans every Plans builds (see builtPlan.id).
var planIDs atomic.Uint64

// withLabel names the policy a store reports for an unnamed rule.
func withLabel(name string) Option { return func(o *options) { o.label = name } }

// withSeed makes a store hash keys with seed (see options.seed).
func withSeed(seed *maphash.Seed) Option { return func(o *options) { o.seed = seed } }

// plan returns key's plan in g: the plan ctx names (see ContextWithPlan),
// else keyPlan's.
func (p *Plans) plan(ctx context.Context, g *planGen, key string) *builtPlan {
	if name, named := ctx.Value(planKey{}).(string); named {
		if bp, ok := g.find(name); ok {
			return bp
		}
		return g.def
	}
	return p.keyPlan(g, key)
}

// keyPlan returns key's plan in g by the plan function: the default if it
// names no plan of g. Check, which has no context to name a plan, asks it
// directly.
func (p *Plans) keyPlan(g *planGen, key string) *builtPlan {
	if p.planOf == nil {
		return g.def
	}
	name := p.planOf(key)
	bp, ok := g.find(name)
	if !ok {
		p.warn.unnamed(key, name, g.set.Default)
		return g.def
	}
	p.warn.named()
	return bp
}

// find returns the plan named name, if g has one: for a few plans by
// comparing names, which is quicker than hashing the name for the map.
func (g *planGen) find(name string) (*builtPlan, bool) {
	if len(g.names) > smallPlanSet {
		bp, ok := g.plans[name]
		return bp, ok
	}
	for i, n := range g.names {
		if n == name {
			return g.byName[i], true
		}
	}
	return nil, false
}

// smallPlanSet is the most plans a rule set looks a name up among by
// comparing it with each plan's (see planGen.find).
const smallPlanSet = 8

// planKey is the context key of ContextWithPlan.
type planKey struct{}

// ContextWithPlan returns a copy of ctx that puts the key of a
// [Plans.CheckContext] or [Plans.Wait] made with it on the plan named plan,
// instead of the one the plan function names: a plan chosen from the
// request rather than from its key (a claim of its credentials, say). A name
// that is not one of the plans means the default plan.
func ContextWithPlan(ctx context.Context, plan string) context.Context {
	return context.WithValue(ctx, planKey{}, plan)
}

// Check asks key's plan to spend cost at the current time, with the
// results and errors of [Composite.Check] (of [Store.Check], for a plan of
// one rule).
func (p *Plans) Check(key string, cost Units) (Decision, error) {
	g := p.gen.Load()
	bp := p.keyPlan(g, key)
	if d, ok := p.checkHeld(g, bp, key, cost); ok {
		return d, nil
	}
	a, err := p.tryOut(context.Background(), key, cost, maxBudget, nil, true, planPick{g, bp})
	if err != nil {
		return a.d, err
	}
	if p.obs != nil {
		observe(p.obs, &a, int64(cost))
	}
	return a.d, a.err
}

// CheckContext is [Plans.Check] for callers that hold a context: it returns
// ctx's error, spending nothing, if ctx has already ended, and it puts the
// key on the plan ctx names, if it names one (see [ContextWithPlan]). It
// makes Plans a [ContextChecker].
func (p *Plans) CheckContext(ctx context.Context, key string, cost Units) (Decision, error) {
	g := p.gen.Load()
	bp := p.plan(ctx, g, key)
	if err := ctx.Err(); err != nil {
		d := bp.comp.layers[0].store.policy().decision()
		bp.name.fill(&d)
		return d, err
	}
	if d, ok := p.checkHeld(g, bp, key, cost); ok {
		return d, nil
	}
	a, err := p.tryOut(ctx, key, cost, maxBudget, nil, true, planPick{g, bp})
	if err != nil {
		return a.d, err
	}
	if p.obs != nil {
		observe(p.obs, &a, int64(cost))
	}
	return a.d, a.err
}

// checkHeld is Check's quick path: a valid cost for a key that bp, its plan
// in g, holds in its one store (a plan of one rule), or that is new to the
// rule set, is decided with that store's lock (and, for a new key, its
// record's), as the attempt would decide it, and told to the Observer
// (see storeCore.checkHeld); ok is false, with nothing done, otherwise,
// and the attempt starts from bp rather than run the plan function again.
// It inlines, so that the Decision is copied once on its way out.
func (p *Plans) checkHeld(g *planGen, bp *builtPlan, key string, cost Units) (d Decision, ok bool) {
	if bp.single != nil {
		d, ok = bp.single.checkHeld(key, cost, p, g, bp)
	}
	return
}

// planPick is a key's plan as found in a rule set (see Plans.tryOut).
type planPick struct {
	g  *planGen
	bp *builtPlan
}

// CheckWithin is [Plans.Check] for a request that may wait at most
// maxDelay for its turn, as [Store.CheckWithin] describes.
func (p *Plans) CheckWithin(key string, cost Units, maxDelay time.Duration) (Decision, error) {
	a, err := p.try(context.Background(), key, cost, max(maxDelay, 0))
	if err != nil {
		return a.d, err
	}
	if a.err == nil && !a.committed && a.d.Allowed {
		a.d = a.tooSlow
	}
	if p.obs != nil {
		observe(p.obs, &a, int64(cost))
	}
	return a.d, a.err
}

// Wait blocks until key's plan admits cost, as [Composite.Wait] does. A
// waiter asleep when an Update changes the rules wakes at once and asks
// again under the new rules, so that no one sleeps out a stale RetryAfter.
func (p *Plans) Wait(ctx context.Context, key string, cost Units) (Decision, error) {
	g := p.gen.Load()
	bp := p.plan(ctx, g, key)
	d, err := bp.comp.checkCost(cost)
	bp.name.fill(&d)
	if err != nil {
		return d, err
	}
	try := func(cost int64, budget time.Duration) attempt {
		a, err := p.try(ctx, key, Units(cost), budget)
		if err != nil {
			a.err = err
		}
		return a
	}
	return waitFor(ctx, p.clock, int64(cost), d, try, p.obs)
}

// try makes one attempt for key under the rule set in force, starting over
// if an Update replaces it before the attempt holds its locks; ctx may name
// the key's plan. The error is a cost error, checked against key's plan.
func (p *Plans) try(ctx context.Context, key string, cost Units, budget time.Duration) (attempt, error) {
	return p.tryOut(ctx, key, cost, budget, nil, false, planPick{})
}

// tryOut is try that also appends the Decision of every enforced layer of
// the key's plan to *out, if out is not nil (see appendLayers), with the
// plan's name for a rule that has none. If counts, the attempt is a
// Check's, which counts a refusal that a plan of one rule counts, as a
// Store's Check does. A pick (not zero) is the key's plan as the caller
// found it: the first attempt starts from it.
func (p *Plans) tryOut(ctx context.Context, key string, cost Units, budget time.Duration, out *[]Decision, counts bool, pick planPick) (attempt, error) {
	var f fence
	defer f.lift()
	for ; ; p.again(&f) {
		g, bp := pick.g, pick.bp
		if g == nil {
			g = p.gen.Load()
			bp = p.plan(ctx, g, key)
		}
		pick = planPick{} // if the rule set is replaced meanwhile, find the plan again
		if d, err := bp.comp.checkCost(cost); err != nil {
			bp.name.fill(&d)
			return attempt{d: d}, err
		}
		from := 0
		if out != nil {
			from = len(*out)
		}
		if a, ok := p.tryIn(g, bp, key, int64(cost), budget, out, counts); ok {
			a.changed = g.done
			if out != nil {
				for i := from; i < len(*out); i++ {
					bp.name.fill(&(*out)[i])
				}
			}
			bp.name.fill(&a.d)
			bp.name.fill(&a.tooSlow)
			bp.name.fill(&a.shadow)
			return a, nil
		}
	}
}

// fence is what an operation on a key that starts over when an Update
// replaces the rule set before it holds its locks (see tryIn) keeps
// between its attempts. A stream of Updates could otherwise start it over
// for as long as it lasts; after unfencedTries attempts it holds Updates
// off (the update lock, for reading, which it takes holding no other
// lock, and which Update takes holding no other) until it is done, so that
// it makes at most unfencedTries+1 attempts. A check of a held key makes
// one, and never takes the lock.
type fence struct {
	tries int
	held  *sync.RWMutex
}

// unfencedTries is how many attempts an operation makes before it holds
// Updates off (see fence).
const unfencedTries = 2

// again counts an attempt that found the rule set replaced, holding
// Updates off from the unfencedTries-th on.
func (p *Plans) again(f *fence) {
	f.tries++
	if f.tries == unfencedTries {
		p.update.RLock()
		f.held = &p.update
	}
}

// lift lets Updates go on, if f held them off.
func (f *fence) lift() {
	if f.held != nil {
		f.held.RUnlock()
	}
}

// shardLock is one shard an attempt locks.
type shardLock struct {
	store keyedStore
	shard int
	ev    evictions // what the shard dropped while locked
}

// lockAll locks every shard in increasing store id order, the one order
// every Plans attempt uses, and returns the agreed instant, recorded in
// every shard. An attempt that is moving a key (one new to its plan's
// stores) marks each shard as held by an insertion once it holds it, so
// that checks waiting for it spin rather than park (see storeShard.hold):
// it holds several shards at once, and the stores it takes from are ones
// its holds add nothing to, which would not be marked otherwise.
func lockAll(locks []shardLock, now int64, moving bool) int64 {
	for i := 1; i < len(locks); i++ { // a few entries: insertion sort, no allocation
		for j := i; j > 0 && locks[j].store.id() < locks[j-1].store.id(); j-- {
			locks[j], locks[j-1] = locks[j-1], locks[j]
		}
	}
	for _, l := range locks {
		now = max(now, l.store.lockShard(l.shard, now))
		if moving {
			l.store.markShard(l.shard)
		}
	}
	for _, l := range locks {
		l.store.raiseShard(l.shard, now)
	}
	return now
}

// unlockAll unlocks every shard, in the reverse order, and then reports
// what they dropped to make room, with no lock held.
func unlockAll(locks []shardLock) {
	for i := len(locks) - 1; i >= 0; i-- {
		locks[i].ev = locks[i].store.unlockShard(locks[i].shard)
	}
	for i := range locks {
		if e := locks[i].ev; e.n|e.lossy != 0 {
			locks[i].store.evicted(e)
			locks[i].ev = evictions{}
		}
	}
}

// tryIn makes one attempt for key on plan bp of generation g; ok is false
// if g was replaced before the attempt held its locks, and nothing was done.
//
// The stores that take part are locked in increasing id order: the plan's
// layer stores, and, when a layer's store does not hold the key, the
// stores of the plan the key's record names (see planRecord), so that it
// moves at one instant with no check of it on either side in between. The
// key's record is locked before any store, and only by an attempt that
// moves or adds the key; since every attempt locks in that order, attempts
// cannot deadlock. An attempt that began on a rule set since replaced finds
// out once it holds its locks and starts over (a few times at most: see
// fence); one that held them first is ordered before the Update, and the
// keys it spent move with what they spent. A budget of peekOnly makes the
// attempt a look (Plans.Peek): it records no instant and spends nothing,
// though a key that moved is still moved. If counts, a refusal that a plan
// of one rule counts is counted, and the Decision is the one after it, as
// a Store's Check gives (see builtPlan.counts).
func (p *Plans) tryIn(g *planGen, bp *builtPlan, key string, cost int64, budget time.Duration, out *[]Decision, counts bool) (attempt, bool) {
	layers := bp.comp.layers
	var buf [inlineLayers]layerTurn
	turns := prepareTurns(layers, key, cost, buf[:0])
	var lbuf [inlineLayers]shardLock
	locks, now, ok := p.lockPlan(g, bp, key, turns, lbuf[:0], budget == peekOnly, budget != peekOnly)
	if !ok {
		return attempt{}, false
	}
	if budget == peekOnly {
		a := attempt{now: now, d: peekLocked(layers, turns, bp.comp.enforced, now, cost)}
		unlockAll(locks)
		return a, true
	}
	a := decideLocked(layers, turns, bp.comp.enforced, now, cost, budget)
	if counts && bp.counts && a.err == nil && !a.d.Allowed {
		a.d = bp.single.stepAt(turns[0].k, now, cost, stepCheck)
	}
	if out != nil && a.err == nil {
		*out = appendLayers(layers, turns, now, a.committed, *out)
	}
	unlockAll(locks)
	if a.err == nil {
		reportShadows(layers, turns, bp.comp.enforced, &a)
	}
	return a, true
}

// lockPlan locks the shards of plan bp's layers for turns, appending them
// to locks, as tryIn describes: when a layer lacks the key, with the stores
// its record names, moving it. It returns the locks to release with
// unlockAll and the agreed instant, which look (a Peek) records nowhere; ok
// is false, with nothing locked, if g was replaced first. Unless adds, a key
// that no move brings in gets no record (it is not added to any store).
func (p *Plans) lockPlan(g *planGen, bp *builtPlan, key string, turns []layerTurn, locks []shardLock, look, adds bool) ([]shardLock, int64, bool) {
	layers := bp.comp.layers
	for i := range turns {
		if turns[i].err == nil {
			locks = append(locks, shardLock{store: layers[i].store, shard: turns[i].shard})
		}
	}
	now := p.lockShards(locks, clampTime(p.clock.Now()), look, false)
	if p.gen.Load() != g {
		unlockAll(locks)
		return nil, 0, false
	}
	// A key whose every layer holds its state stays where it is: no
	// state of the key's own outlives its record (a Reset drops them
	// together, see Plans.Reset), but by the record's loss to make room.
	if !lacking(layers, turns, now, g.shared) {
		return locks, now, true
	}
	rk := p.recordKey(layers, turns, key)
	// A key new to the rule set, the common case, has no record: if the
	// record's lock is free, holding the stores' locks out of order cannot
	// deadlock (it does not wait), and there is nothing to move.
	if adds && p.records.add(rk, planRecord{plan: bp.id, lineage: bp.lineage}, now) {
		return locks, now, true
	}
	if id, found, locked := p.records.look(rk); !adds && locked && !found || found && id == bp.id {
		return locks, now, true // new, or on its plan already: nothing to move
	}
	rs := &p.records.shards[rk.h&p.records.mask]
	// Relock holding the key's record, with the stores it names.
	unlockAll(locks)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var from *recordedPlan
	rec := rs.t.Find(rk.key, rk.tag)
	if rec != nil && rec.id() != bp.id {
		from = g.recorded(rec)
	}
	if from != nil && sameStores(from.bp.comp.layers, layers) {
		// An Update kept every store of the plan the record names: the key
		// has not moved, and keeps what its last move carried in.
		from = nil
	}
	var srcBuf [inlineLayers]source
	srcs := srcBuf[:0]
	if from != nil {
		fl := from.bp.comp.layers
		for i := range turns {
			var src source
			if i < len(fl) && turns[i].err == nil && fl[i].store != layers[i].store && movesLayer(fl[i].key, layers[i].key, from.bp.name == bp.name) {
				src = source{store: fl[i].store, k: fl[i].store.prepare(layerKey(fl[i].key, key))}
				locks = append(locks, shardLock{store: src.store, shard: src.store.shardIndex(src.k)})
			}
			srcs = append(srcs, src)
		}
	}
	now = p.lockShards(locks, now, look, true)
	if p.gen.Load() != g {
		unlockAll(locks)
		return nil, 0, false
	}
	moved := false
	var r planRecord
	if rec != nil {
		r = *rec
	}
	next := r
	next.plan = bp.id | r.plan&recordCarries
	next.lineage = bp.lineage
	var carry moveRecord // what the move carries into the first layer
	if from != nil {
		policy := g.set.OnMove
		if from.bp.name == bp.name {
			policy = from.policy // the same plan, replaced by an Update
		}
		next = planRecord{plan: bp.id, lineage: bp.lineage}
		carry.at = now
		for i := range turns {
			t := &turns[i]
			l := &layers[i]
			src := srcs[i].store
			// A look or a refund moves only a state that holds something
			// spent: an entry as good as fresh (a refused check leaves one)
			// is no move, and the record keeps naming the plan whose other
			// layers may still hold the key's own state, as in Redis.
			if src == nil || l.store.holdsSpent(t.k, now) || !adds && !src.holdsSpent(srcs[i].k, now) {
				continue
			}
			spent, whole, ok := src.take(srcs[i].k, now)
			if !ok {
				continue
			}
			moved = true
			var first *moveRecord
			if i == 0 {
				m := rs.carry(rk, &r)
				first = &m
			}
			to := l.store.capacity()
			ts := moveAmounts(first, src, spent, whole, now, policy, src.capacity(), to)
			x, whole := satAdd(ts[0].x, ts[1].x), ts[1].until
			if x <= 0 || whole <= now || !l.store.acquire(t.k, now) {
				continue
			}
			held := min(x, to)
			l.store.setSpent(t.k, now, held, whole)
			if i == 0 {
				carry.until, carry.x, carry.held = whole, ts[1].x, held
				carry.until0, carry.x0 = ts[0].until, ts[0].x
				for c := bp.carried.Load(); c < whole; c = bp.carried.Load() {
					if bp.carried.CompareAndSwap(c, whole) {
						break
					}
				}
			}
		}
	}
	if !adds && !moved {
		return locks, now, true // a look, or a refund, adds no key
	}
	if from != nil && from.bp.own && !bp.own {
		// Nothing of the key's own can be held on bp (its every layer has
		// a Key): the record keeps naming the plan that holds the key's own
		// state, for the key's next move, or a Reset, to find it there.
		return locks, now, true
	}
	if rec == nil {
		rec, _ = rs.t.Insert(rk.key, rk.tag, now) // nothing is pinned: always room
	}
	if from != nil {
		next.plan |= r.plan & recordCarries // for setCarry to drop the old one
		rs.setCarry(rk, &next, carry, now)
	}
	*rec = next
	return locks, now, true
}

// recordKey returns key prepared for its record: as a layer of the key's
// own (without a Key) prepared it for its store, since the Plans' stores
// hash with the records' seed (see withSeed), or else afresh.
func (p *Plans) recordKey(layers []compositeLayer, turns []layerTurn, key string) storeKey {
	for i := range turns {
		if layers[i].key == nil && turns[i].err == nil {
			return turns[i].k
		}
	}
	return p.records.prepare(key)
}

// moveAmounts returns what a layer's state that shows spent in use at now,
// whole again at whole, moves on with under policy from a rule of capacity
// from to one of capacity to: for a plan's first layer (r not nil), with
// what the key's move record still holds (see moveRecord.carry); as at most
// two amounts, the later last, whose sum moves, whole again at the later's
// instant. The amounts are not capped at the new capacity: the record keeps
// what a cap cuts off, for the key's next move. Plans and MoveState move a
// key by it.
func moveAmounts(r *moveRecord, src holder, spent, whole, now int64, policy Migration, from, to int64) [2]tranche {
	ts := [2]tranche{{}, {spent, whole}}
	if r != nil {
		ts = r.carry(src, spent, whole, now)
	}
	if policy == MigrateProportional || policy == MigrateAdditive {
		ts[0].x, ts[1].x = policy.carry(ts[0].x, from, to), policy.carry(ts[1].x, from, to)
	} else { // a policy of the sum: one amount
		ts = [2]tranche{{}, {policy.carry(satAdd(ts[0].x, ts[1].x), from, to), ts[1].until}}
	}
	return ts
}

// carry returns what a first layer's state that shows spent in use at now,
// whole again at whole, moves on with, by the record of its last move (see
// moveRecord): what of the amounts that move carried in is not yet given
// back, each with its instant, plus what the state holds beyond what it
// was given (what was admitted since), given back at whole; as at most two
// amounts, the later last.
func (r *moveRecord) carry(src holder, spent, whole, now int64) [2]tranche {
	since := max(spent-src.heldAt(r.at, r.held, r.until, now), 0)
	return r.pending(since, whole, now)
}

// recorded returns the plan a key's record names: that plan, if g still
// knows it, or else the oldest plan of its lineage newer than it that g
// still knows (a replaced one, or g's own), whose stores hold what is left
// of the key's state (nil if none). The stores of a plan that left the
// replaced ones only to make room (see maxReplaced) may still hold keys,
// and every store it shared with its successor, as one an Update kept does,
// is the successor's too: found through it, the key moves with what it spent
// instead of starting fresh.
func (g *planGen) recorded(rec *planRecord) *recordedPlan {
	id := rec.id()
	if r := g.byID[id]; r != nil {
		return r
	}
	for i := len(g.replaced) - 1; i >= 0; i-- { // oldest first
		if r := g.replaced[i]; r.bp.lineage == rec.lineage && r.bp.id > id {
			return r
		}
	}
	return g.byLineage[rec.lineage]
}

// source is the store a layer's key moves from, and the key there.
type source struct {
	store keyedStore // nil: none
	k     storeKey
}

// lockShards is lockAll, or lookAll for a look, which records no instant.
func (p *Plans) lockShards(locks []shardLock, now int64, look, moving bool) int64 {
	if look {
		return lookAll(locks, now)
	}
	return lockAll(locks, now, moving)
}

// sameStores reports whether two plans' layers are the same stores, in
// the same order.
func sameStores(a, b []compositeLayer) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].store != b[i].store {
			return false
		}
	}
	return true
}

// movesLayer reports whether a key's move from one plan to another (or to
// the same plan under an Update's rules: samePlan) takes the state of a
// layer with key function from into the layer with key function to at the
// same place. A layer with a Key holds a state that every key it maps to
// the same layer key shares (a global limit, a customer's): it is the
// plan's, not the key's, so a key that moves to another plan leaves it
// where it is, to the keys still on the old plan, and finds the new plan's
// as it stands. Only an Update that changes such a layer's rule moves its
// state, once and whole, to the rule that replaces it. A layer that is a
// key's own on one side and shared on the other moves nothing either way.
func movesLayer(from, to func(string) string, samePlan bool) bool {
	if from == nil || to == nil {
		return from == nil && to == nil
	}
	return samePlan
}

// layerKey is a layer's key for key, by the layer's Key function if any.
func layerKey(keyFn func(string) string, key string) string {
	if keyFn != nil {
		return keyFn(key)
	}
	return key
}

// lacking reports, with the layers' shards locked, whether a layer's store
// lacks the key. If shared (see planGen), it also lacks a key it holds
// nothing spent for: an entry as good as fresh says nothing of whether the
// key moved in (a check that a layer with a Key refused leaves one, a
// layer with a Key shares its entry with every key that maps to it, and a
// key that moved to a plan whose layer at that place has a Key left its
// own behind), and a backend lets it expire.
func lacking(layers []compositeLayer, turns []layerTurn, now int64, shared bool) bool {
	for i := range turns {
		t, st := &turns[i], layers[i].store
		if t.err == nil && (shared && !st.holdsSpent(t.k, now) || !st.has(t.k)) {
			return true
		}
	}
	return false
}
