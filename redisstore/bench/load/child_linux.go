package load

import "syscall"

// childAttr makes a child process die with this one, should this one end
// without stopping it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
