//go:build race

package ratelimit_test

func init() { raceEnabled = true }
