//go:build !linux

package table

import "time"

// threadUsage is not measured here.
func threadUsage() (time.Duration, int64) { return -1, -1 }
