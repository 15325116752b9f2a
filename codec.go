package ratelimit

// State codecs for [Machine]: each algorithm reads and writes its state as
// the integers Machine documents, and checks that a state read is one its
// rule could have produced, so that a corrupted state is an error rather
// than a decision. Those include states in debt (see [Store.Settle]): a key
// may have up to twice its capacity in use.

func (p *policy) params(capMilli int64) Params {
	return Params{Policy: p.name, Limit: p.limit, Window: p.window, Capacity: Units(capMilli)}
}

// The meter's state is one vtime: "t f".

func (m *meter) decodeAt(fields []int64, s *vtime, now int64) error {
	switch len(fields) {
	case 0:
		return nil
	case 2:
	default:
		return badState("bucket", "wants 2 numbers after the instant")
	}
	t, f := fields[0], fields[1]
	if uint64(f) >= m.n {
		return badState("bucket", "fraction is not below RateUnits")
	}
	// Every state was written at an instant no later than now, and runs at
	// most twice the capacity's span ahead of the instant it was written
	// at (once in debt).
	tn, tf := 2*m.tauNs, 2*m.tauFrac // < 2^63, and < 2n
	if tf >= m.n {
		tn, tf = tn+1, tf-m.n
	}
	if t > now && (uint64(t-now) > tn || (uint64(t-now) == tn && uint64(f) > tf)) {
		return badState("bucket", "arrival time is more than twice the capacity's span ahead of the key's latest instant")
	}
	*s = vtime{t: t, frac: uint64(f)}
	return nil
}

func (m *meter) encode(dst []byte, s *vtime) []byte {
	return appendInts(dst, s.t, int64(s.frac))
}

func (m *meter) params() Params {
	p := m.pol.params(m.capMilli)
	p.RateUnits, p.RateNanos = m.n, m.p
	p.TauNanos, p.TauFrac = m.tauNs, m.tauFrac
	return p
}

// The fixed window's state: "w c".

func (a *fwAlgo) decodeAt(fields []int64, s *fwState, now int64) error {
	switch len(fields) {
	case 0:
		return nil
	case 2:
	default:
		return badState("fixed_window", "wants 2 numbers after the instant")
	}
	w, c := fields[0], fields[1]
	switch {
	case w > now/a.w+1:
		// A count in the window after now's is a key moved in by a Plans
		// (see fwAlgo.withSpent): it applies from now on. Any later
		// window is beyond what a move writes.
		return badState("fixed_window", "window is later than the one after the key's latest instant")
	case c > 2*a.capMilli:
		return badState("fixed_window", "count is above twice the limit")
	}
	*s = fwState{win: w, count: c}
	return nil
}

func (a *fwAlgo) encode(dst []byte, s *fwState) []byte { return appendInts(dst, s.win, s.count) }

func (a *fwAlgo) params() Params {
	p := a.pol.params(a.capMilli)
	p.WindowNanos = a.w
	return p
}

// The sliding counter's state: "w p c".

func (a *scAlgo) decodeAt(fields []int64, s *scState, now int64) error {
	switch len(fields) {
	case 0:
		return nil
	case 3:
	default:
		return badState("sliding_counter", "wants 3 numbers after the instant")
	}
	w, p, c := fields[0], fields[1], fields[2]
	switch {
	case w > now/a.w:
		return badState("sliding_counter", "window is later than the key's latest instant")
	case p > 2*a.capMilli || c > 2*a.capMilli:
		return badState("sliding_counter", "a count is above twice the limit")
	}
	*s = scState{win: w, prev: p, cur: c}
	return nil
}

func (a *scAlgo) encode(dst []byte, s *scState) []byte {
	return appendInts(dst, s.win, s.prev, s.cur)
}

// A compact key reads and writes the same fields: decodeAt's bound on the
// counts, twice the capacity, is what makes them fit.

func (a *scCompactAlgo) decodeAt(fields []int64, s *scCompact, now int64) error {
	var w scState
	if err := a.scAlgo.decodeAt(fields, &w, now); err != nil {
		return err
	}
	*s = w.compact()
	return nil
}

func (a *scCompactAlgo) encode(dst []byte, s *scCompact) []byte {
	w := s.wide()
	return a.scAlgo.encode(dst, &w)
}

func (a *scAlgo) params() Params {
	p := a.pol.params(a.capMilli)
	p.WindowNanos = a.w
	p.CountRefused = a.refused
	return p
}

// The sliding log's state: pairs "t c", oldest first.

func (a *slAlgo) decodeAt(fields []int64, s *slState, now int64) error {
	if len(fields)%2 != 0 {
		return badState("sliding_log", "wants pairs of numbers after the instant")
	}
	n := len(fields) / 2
	if n == 0 {
		return nil
	}
	size := 1
	for size < n {
		size *= 2
	}
	buf := make([]slEvent, n, size)
	var cum uint64
	var live int64 // cost still counted at now
	for i := range n {
		t, c := fields[2*i], fields[2*i+1]
		switch {
		case t > now:
			return badState("sliding_log", "an entry is later than the key's latest instant")
		case i > 0 && t <= buf[i-1].t:
			return badState("sliding_log", "entries are not in strictly increasing time order")
		case c <= 0 || c > 2*a.capMilli:
			return badState("sliding_log", "an entry's cost is not from 1 to twice the limit")
		}
		cum += uint64(c)
		buf[i] = slEvent{t: t, cum: cum}
		if t+a.window > now {
			if live += c; live > 2*a.capMilli {
				return badState("sliding_log", "the cost inside the window is above twice the limit")
			}
		}
	}
	*s = slState{buf: buf}
	return nil
}

func (a *slAlgo) encode(dst []byte, s *slState) []byte {
	prev := s.base
	for i := range len(s.buf) {
		e := s.at(i)
		dst = appendInts(dst, e.t, int64(e.cum-prev))
		prev = e.cum
	}
	return dst
}

func (a *slAlgo) params() Params {
	p := a.pol.params(a.capMilli)
	p.WindowNanos = a.window
	return p
}

// The sub-window counter's state: "c n...", the index of the latest bucket
// counted into and the counts of the k buckets ending with it, oldest first.

func (a *swAlgo[A]) decodeAt(fields []int64, s *swState[A], now int64) error {
	switch int64(len(fields)) {
	case 0:
		return nil
	case a.k + 1:
	default:
		return badState("sub_window", "wants the bucket's index and one count per bucket after the instant")
	}
	c := fields[0]
	if c > now/a.g {
		return badState("sub_window", "bucket is later than the key's latest instant")
	}
	var t swState[A]
	t.last = c
	var sum int64
	for i, n := range fields[1:] {
		if n > 2*a.capMilli {
			return badState("sub_window", "a count is above twice the limit")
		}
		j := c - a.k + 1 + int64(i)
		if j < 0 && n != 0 {
			return badState("sub_window", "a bucket before the clock's origin holds a count")
		}
		sum += n // k counts of at most 2 capMilli: checked one by one
		if !a.refused && sum > 2*a.capMilli {
			return badState("sub_window", "the window's count is above twice the limit")
		}
		if j >= 0 {
			t.n[j%a.k] = n
		}
	}
	*s = t
	return nil
}

func (a *swAlgo[A]) encode(dst []byte, s *swState[A]) []byte {
	dst = appendInts(dst, s.last)
	for j := s.last - a.k + 1; j <= s.last; j++ {
		dst = appendInts(dst, a.count(s, s.last, j))
	}
	return dst
}

func (a *swAlgo[A]) params() Params {
	p := a.pol.params(a.capMilli)
	p.WindowNanos = a.g * a.k
	p.Buckets = a.k
	p.CountRefused = a.refused
	return p
}
