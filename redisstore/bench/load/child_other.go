//go:build !linux

package load

import "syscall"

func childAttr() *syscall.SysProcAttr { return nil }
