package ratelimit

// PlansReplaced returns how many replaced plans p keeps (for tests).
func PlansReplaced(p *Plans) int { return len(p.gen.Load().replaced) }
