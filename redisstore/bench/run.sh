#!/usr/bin/env bash
# Runs the Redis peer benchmarks PASSES times (default 6), each pass every
# subject one after the other, rather than -count N of each in a row: a
# burst of other work on the machine then hits one pass of everything
# rather than every sample of one subject. Prints the memory per key once,
# writes every pass's raw output to OUT (default redis-peers.txt) and
# benchstat's medians of it. Needs redis-server on PATH; benchstat comes
# through the module proxy. About 20 s a pass on 2 cores.
set -euo pipefail
cd "$(dirname "$0")"

passes=${PASSES:-6}
benchtime=${BENCHTIME:-20000x}
out=${OUT:-redis-peers.txt}

go test -count=1 -run TestMemoryPerKey -v . | grep -E 'bytes in'
: > "$out"
for i in $(seq "$passes"); do
	echo "pass $i of $passes" >&2
	go test -count=1 -run '^$' -bench . -benchtime "$benchtime" . | grep -E '^(goos|goarch|pkg|cpu|Benchmark)' >> "$out"
done
go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da "$out"
