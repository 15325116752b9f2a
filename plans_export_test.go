package ratelimit

// PlansReplaced returns how many replaced plans p keeps (for tests).
func PlansReplaced(p *Plans) int { return len(p.gen.Load().replaced) }

// TryUpdate is Plans.Update if no Update is under way and no attempt holds
// Updates off (see fence), and reports whether it ran (for tests).
func TryUpdate(p *Plans, set PlanSet, m Migration) (bool, error) {
	if !p.update.TryLock() {
		return false, nil
	}
	defer p.update.Unlock()
	return true, p.replace(set, m)
}
