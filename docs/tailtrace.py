#!/usr/bin/env python3
"""Says what TestTail's slowest checks overlapped, from its execution trace.

    go test -c -o /tmp/tail.test .
    /tmp/tail.test -test.run TestTail -tail -tailonly '^store$' -tailrounds 1 -tailtrace /tmp/tail.trace
    go tool trace -d=parsed /tmp/tail.trace | python3 docs/tailtrace.py 50

For each of the N slowest checks TestTail logged (category "slow": every
check over 200 us), it gives the microseconds of the check that overlapped a
stop-the-world phase, the collector's concurrent mark phase, a mark assist
or a sweep on the check's goroutine, and the goroutine's own states: runnable
(descheduled by the Go scheduler), waiting on a lock (sync), waiting on
anything else, and running (which includes time the machine took the thread
away, which the trace cannot see). Then the shares over those checks, and the
run's collection cycles, stop-the-world phases and assists.
"""
import re, sys, collections
N = int(sys.argv[1]) if len(sys.argv) > 1 else 50
head = re.compile(r'^M=(-?\d+) P=(-?\d+) G=(-?\d+) (\w+) Time=(\d+)(.*)$')
ranges = []          # (name, scope, start, end)
open_ranges = {}
states = collections.defaultdict(list)  # goid -> [(time, state, reason)]
logs = []            # (g, end, dur)
for line in sys.stdin:
    m = head.match(line)
    if not m:
        continue
    _, p, g, kind, t, rest = m.groups()
    t = int(t)
    if kind == 'RangeBegin' or kind == 'RangeEnd':
        name = re.search(r'Name="([^"]*)"', rest).group(1)
        sc = re.search(r'Scope=(\S+)', rest)
        scope = sc.group(1) if sc else ''
        key = (name, scope)
        if kind == 'RangeBegin':
            open_ranges[key] = t
        elif key in open_ranges:
            ranges.append((name, scope, open_ranges.pop(key), t))
    elif kind == 'StateTransition':
        mm = re.search(r'GoID=(\d+) (\w+)->(\w+) Reason="([^"]*)"', rest)
        if mm:
            states[int(mm.group(1))].append((t, mm.group(3), mm.group(4)))
    elif kind == 'Log' and 'Category="slow"' in rest:
        msg = re.search(r'Message="(\d+) (\d+)"', rest)
        logs.append((int(g), t, int(msg.group(2))))

def overlap(a0, a1, b0, b1):
    return max(0, min(a1, b1) - max(a0, b0))

logs.sort(key=lambda x: -x[2])
tot = collections.Counter()
print("%-10s %8s %8s %8s %8s %8s %8s %8s %8s" % ("check µs", "stw", "mark", "assist", "sweep", "runnable", "waitsync", "other-w", "running"))
for g, end, dur in logs[:N]:
    s0 = end - dur
    c = collections.Counter()
    for name, scope, r0, r1 in ranges:
        o = overlap(s0, end, r0, r1)
        if not o:
            continue
        if name.startswith('stop-the-world'):
            c['stw'] += o
        elif name == 'GC concurrent mark phase':
            c['mark'] += o
        elif name == 'GC mark assist' and scope == 'Goroutine(%d)' % g:
            c['assist'] += o
        elif name == 'GC incremental sweep' and scope == 'Goroutine(%d)' % g:
            c['sweep'] += o
    st = states[g]
    for i, (t, state, reason) in enumerate(st):
        t1 = st[i + 1][0] if i + 1 < len(st) else end
        o = overlap(s0, end, t, t1)
        if not o:
            continue
        if state == 'Runnable':
            c['runnable'] += o
        elif state == 'Waiting':
            c['waitsync' if reason == 'sync' else 'other-w'] += o
        elif state == 'Running':
            c['running'] += o
    tot.update(c)
    tot['dur'] += dur
    f = lambda k: c[k] / 1000
    print("%-10.0f %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f" % (dur / 1000, f('stw'), f('mark'), f('assist'), f('sweep'), f('runnable'), f('waitsync'), f('other-w'), f('running')))
print("share of the %d slowest checks' time:" % min(N, len(logs)), {k: round(v / tot['dur'], 3) for k, v in tot.items() if k != 'dur'})
gcs = [r for r in ranges if r[0] == 'GC concurrent mark phase']
stw = [r for r in ranges if r[0].startswith('stop-the-world')]
print("GC cycles %d, mark phase total %.1f ms (longest %.2f ms), STW %d totalling %.2f ms (longest %.0f µs), assists %d totalling %.2f ms" % (
    len(gcs), sum(r[3]-r[2] for r in gcs)/1e6, max([r[3]-r[2] for r in gcs] or [0])/1e6, len(stw), sum(r[3]-r[2] for r in stw)/1e6,
    max([r[3]-r[2] for r in stw] or [0])/1e3, sum(1 for r in ranges if r[0]=='GC mark assist'), sum(r[3]-r[2] for r in ranges if r[0]=='GC mark assist')/1e6))
print("slow checks logged (> 200 µs): %d" % len(logs))
