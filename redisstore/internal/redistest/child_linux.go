package redistest

import "syscall"

// childAttr makes a server die with the process that started it, should
// that process end (a test binary's timeout, say) without stopping it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
