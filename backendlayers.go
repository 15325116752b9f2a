package ratelimit

import (
	"fmt"
	"time"
)

// LayeredMachine is a [Composite]'s decision as a pure function of its
// layers' encoded states: what a backend that keeps the states of several
// limits outside the process (a Redis script over several keys, say) needs
// to decide about one request on all of them, all or nothing, exactly as
// the in-process Composite does. It is built by [NewLayeredMachine], is
// immutable and is safe for concurrent use.
//
// A LayeredMachine decides with the Composite's own code: it looks at every
// layer at one instant, commits the request to every enforced layer (and to
// every shadow layer that would have admitted it itself) only if every
// enforced layer admits it, and makes the Decision by the Composite's rules
// (the most constraining enforced layer, the longest RetryAfter, the
// composite's Remaining, Shadowed). Layer.Key, Layer.OnShadow and
// Layer.Options play no part: the backend derives the keys and passes the
// shadow reports on.
type LayeredMachine struct {
	machines []*Machine
	shadow   []bool
	enforced int
}

// NewLayeredMachine validates every layer's rule and returns the machine
// deciding over them in the order given. A malformed rule is an error
// matching [ErrInvalidRule], naming the layer. At least one layer is needed.
func NewLayeredMachine(layers []Layer) (*LayeredMachine, error) {
	if len(layers) == 0 {
		return nil, &RuleError{Rule: "LayeredMachine", Field: "layers", Reason: "is empty"}
	}
	lm := &LayeredMachine{machines: make([]*Machine, len(layers)), shadow: make([]bool, len(layers))}
	for i, l := range layers {
		if isNil(l.Rule) {
			return nil, &RuleError{Rule: "LayeredMachine", Field: fmt.Sprintf("layers[%d].Rule", i), Reason: "is nil"}
		}
		m, err := NewMachine(l.Rule)
		if err != nil {
			return nil, fmt.Errorf("ratelimit: layer %d: %w", i, err)
		}
		lm.machines[i], lm.shadow[i] = m, l.Shadow
		if !l.Shadow {
			lm.enforced++
		}
	}
	return lm, nil
}

// Len returns the number of layers.
func (lm *LayeredMachine) Len() int { return len(lm.machines) }

// Machine returns layer i's [Machine].
func (lm *LayeredMachine) Machine(i int) *Machine { return lm.machines[i] }

// Takes reports whether layer i takes part in a request of cost: every
// enforced layer does, and a shadow layer does unless cost is above its
// capacity (it then sits the request out, reporting [ErrCostExceedsCapacity],
// and its state is neither read nor changed).
func (lm *LayeredMachine) Takes(i int, cost Units) bool {
	return !lm.shadow[i] || cost <= lm.machines[i].params.Capacity
}

// Instant returns the one instant a request at now is decided at: now
// clamped into [0, [MaxTime]], raised to the latest instant recorded in
// the state of any layer that takes part, so that no key sees time go
// back.
func (lm *LayeredMachine) Instant(states [][]byte, now time.Duration, cost Units) (time.Duration, error) {
	if len(states) != len(lm.machines) {
		return 0, fmt.Errorf("ratelimit: %d states for %d layers", len(states), len(lm.machines))
	}
	t := clampTime(now)
	for i, s := range states {
		if !lm.Takes(i, cost) {
			continue
		}
		fields, err := parseState(s)
		if err != nil {
			return 0, fmt.Errorf("layer %d: %w", i, err)
		}
		if len(fields) > 0 {
			if fields[0] > int64(MaxTime) {
				return 0, fmt.Errorf("layer %d: %w: latest instant %d is beyond MaxTime", i, ErrInvalidState, fields[0])
			}
			t = max(t, fields[0])
		}
	}
	return time.Duration(t), nil
}

// Step decides whether cost can be admitted at now on the layers whose
// states are states (one per layer, in layer order; empty is a fresh key),
// exactly as [Composite.Check] would. All layers are decided at one
// instant, [LayeredMachine.Instant]. It returns the Decision, the layers'
// states after it and one ShadowReport per shadow layer, in layer order,
// with Key left empty for the backend to fill in.
//
// With commit false the states returned are states, unchanged. With commit
// true, if every enforced layer admits the request, every enforced layer's
// state and every shadow layer's that admits it itself are the new ones,
// recording the instant; the others are unchanged. A denied request changes
// no state at all.
//
// Cost errors are Composite.Check's, with nothing reported. A state that
// does not parse, or that its layer's rule could not have produced, is an
// error matching [ErrInvalidState] naming the layer, with a Decision that
// admits nothing.
func (lm *LayeredMachine) Step(states [][]byte, now time.Duration, cost Units, commit bool) (Decision, [][]byte, []ShadowReport, error) {
	a, next, reports, err := lm.step(states, now, cost, commit, maxBudget, nil)
	return a.d, next, reports, err
}

// StepLayers is [LayeredMachine.Step] that also appends to dst, in layer
// order, the Decision of every enforced layer, as [Composite.CheckLayers]
// does, and returns the extended slice; on an error nothing is appended.
func (lm *LayeredMachine) StepLayers(states [][]byte, now time.Duration, cost Units, commit bool, dst []Decision) (Decision, [][]byte, []ShadowReport, []Decision, error) {
	a, next, reports, err := lm.step(states, now, cost, commit, maxBudget, &dst)
	return a.d, next, reports, dst, err
}

// Attempt is one admission attempt of a request that may wait a bounded
// time for its turn, as [LayeredMachine.StepWithin] decides it.
type Attempt struct {
	// Decision is Step's with commit. For a request every enforced layer
	// admits but whose Delay is over the bound, it is that admission's,
	// Allowed, though nothing was committed.
	Decision Decision
	// Committed reports that the request was admitted within the bound:
	// the states returned are the new ones.
	Committed bool
	// GoOn is how long after the Decision's instant the request would go
	// on if nothing else arrived: an admissible request's Delay, and for a
	// denied one its RetryAfter plus the Delay it would then be admitted
	// with. [Composite.Wait] gives up when it is over the time left.
	GoOn time.Duration
	// TooSlow, for an admissible request not committed, is the refusal
	// [Composite.CheckWithin] reports for it: the enforced layer with the
	// longest Delay, with a RetryAfter after which the queue has drained
	// enough.
	TooSlow Decision
}

// StepWithin is [LayeredMachine.Step] with commit for a request that may
// wait at most maxDelay for its turn: it commits the request only if every
// enforced layer admits it and its Delay (a leaky bucket's) is at most
// maxDelay, exactly as one attempt of [Composite.Wait] (maxDelay the time
// left until the context's deadline) or [Composite.CheckWithin] (maxDelay
// at least 0) decides. States are returned changed only when the attempt
// committed. Its errors are Step's.
func (lm *LayeredMachine) StepWithin(states [][]byte, now time.Duration, cost Units, maxDelay time.Duration) (Attempt, [][]byte, []ShadowReport, error) {
	a, next, reports, err := lm.step(states, now, cost, true, maxDelay, nil)
	return a.attempt(), next, reports, err
}

// StepWithinLayers is [LayeredMachine.StepWithin] that also appends to
// dst, in layer order, the Decision of every enforced layer, as
// [Composite.CheckLayers] with a positive maxDelay does, and returns the
// extended slice; on an error nothing is appended.
func (lm *LayeredMachine) StepWithinLayers(states [][]byte, now time.Duration, cost Units, maxDelay time.Duration, dst []Decision) (Attempt, [][]byte, []ShadowReport, []Decision, error) {
	a, next, reports, err := lm.step(states, now, cost, true, maxDelay, &dst)
	return a.attempt(), next, reports, dst, err
}

// attempt is a as the exported Attempt.
func (a *attempt) attempt() Attempt {
	return Attempt{Decision: a.d, Committed: a.committed, GoOn: a.goOn, TooSlow: a.tooSlow}
}

// step is Step for a request that may wait at most budget, appending the
// enforced layers' Decisions to *out if out is not nil.
func (lm *LayeredMachine) step(states [][]byte, now time.Duration, cost Units, commit bool, budget time.Duration, out *[]Decision) (attempt, [][]byte, []ShadowReport, error) {
	layers := make([]compositeLayer, len(lm.machines))
	stores := make([]machineStore, len(lm.machines))
	first := -1
	for i, m := range lm.machines {
		stores[i] = machineStore{m: m}
		layers[i] = compositeLayer{store: &stores[i], shadow: lm.shadow[i]}
		if first < 0 && !lm.shadow[i] {
			first = i
		}
	}
	if first < 0 {
		first = 0
	}
	// Cost errors, as Composite.checkCost finds them.
	if cost <= 0 {
		d, err := checkCost(cost, stores[first].capacity(), stores[first].policy())
		return attempt{d: d}, states, nil, err
	}
	for i := range stores {
		if !lm.shadow[i] && int64(cost) > stores[i].capacity() {
			d, err := checkCost(cost, stores[i].capacity(), stores[i].policy())
			return attempt{d: d}, states, nil, err
		}
	}
	refused := attempt{d: stores[first].policy().decision()}
	t, err := lm.Instant(states, now, cost)
	if err != nil {
		return refused, states, nil, err
	}
	turns := make([]layerTurn, len(lm.machines))
	for i := range turns {
		stores[i].state = states[i]
		if !lm.Takes(i, cost) {
			turns[i].d, turns[i].err = checkCost(cost, stores[i].capacity(), stores[i].policy())
			continue
		}
		// Validate the state once, so that the steps below cannot fail.
		if _, _, err := lm.machines[i].Step(states[i], t, cost, false); err != nil {
			return refused, states, nil, fmt.Errorf("layer %d: %w", i, err)
		}
	}
	var a attempt
	if commit {
		a = decideLocked(layers, turns, lm.enforced, int64(t), int64(cost), budget)
	} else {
		a = lookLayers(layers, turns, lm.enforced, int64(t), int64(cost))
	}
	if out != nil && a.err == nil {
		for i := range layers {
			layers[i].store.(*machineStore).frozen = true // describing, not spending
		}
		*out = appendLayers(layers, turns, int64(t), commit && a.committed, *out)
		for i := range layers {
			layers[i].store.(*machineStore).frozen = false
		}
	}
	var reports []ShadowReport
	for i := range layers {
		if layers[i].shadow {
			layers[i].report = func(r ShadowReport) { reports = append(reports, r) }
		}
	}
	reportShadows(layers, turns, lm.enforced, &a)
	if !commit || !a.committed {
		return a, states, reports, nil
	}
	next := make([][]byte, len(states))
	for i := range stores {
		next[i] = stores[i].state
	}
	return a, next, reports, nil
}

// lookLayers is decideLocked without the commit: the Decision the attempt
// would make, with every state left as it is.
func lookLayers(layers []compositeLayer, turns []layerTurn, enforced int, now, cost int64) attempt {
	for i := range layers {
		layers[i].store.(*machineStore).frozen = true
	}
	a := decideLocked(layers, turns, enforced, now, cost, maxBudget)
	for i := range layers {
		layers[i].store.(*machineStore).frozen = false
	}
	return a
}

// machineStore is one layer's encoded state seen as the store decideLocked
// and reportShadows decide on. It has the one key they ask about, already
// acquired, and only the methods they call: the rest of keyedStore is left
// to the nil interface it embeds, which no attempt on a LayeredMachine
// reaches.
type machineStore struct {
	keyedStore // nil
	m          *Machine
	state      []byte
	frozen     bool // a look: commits change nothing
}

func (s *machineStore) acquire(storeKey, int64) bool { return true }
func (s *machineStore) capacity() int64              { return int64(s.m.params.Capacity) }
func (s *machineStore) policy() *policy              { return s.m.core.policy() }

// stepAt steps the layer's state, validated by LayeredMachine.Step, so it
// cannot fail.
func (s *machineStore) stepAt(_ storeKey, now, cost int64, m stepMode) Decision {
	if s.frozen && m.commits() {
		m = stepLook // a commit that a look makes is of an admitted request
	}
	d, next, err := s.m.step(s.state, time.Duration(now), Units(cost), m)
	if err != nil {
		panic(fmt.Sprintf("ratelimit: a validated state failed: %v", err))
	}
	if m.commits() {
		s.state = next
	}
	return d
}
