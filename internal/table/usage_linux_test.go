package table

import (
	"syscall"
	"time"
	"unsafe"
)

// threadUsage returns the CPU time the calling thread has used, user and
// system (CLOCK_THREAD_CPUTIME_ID), and the page faults it has taken,
// minor and major (getrusage's RUSAGE_THREAD): what a latency measured in
// wall time is, less the time the machine gave the thread's processor to
// others.
func threadUsage() (time.Duration, int64) {
	const clockThreadCPU, rusageThread = 3, 1
	var ts syscall.Timespec
	if _, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPU, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return -1, -1
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return -1, -1
	}
	return time.Duration(ts.Nano()), ru.Minflt + ru.Majflt
}
