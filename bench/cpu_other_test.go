//go:build !unix

package bench

// cpuNanos is not measured here.
func cpuNanos() int64 { return -1 }
