package httplimit

// WatchEveryRequest makes the misconfiguration checks look at every
// request rather than a sample, and forgets the warnings written, so that
// a test sees them from the start.
func WatchEveryRequest(on bool) {
	watchAll.Store(on)
	warned.forwarded.Store(false)
	warned.shared.Store(false)
}
