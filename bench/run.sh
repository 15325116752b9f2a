#!/usr/bin/env bash
# Benchmarks ratelimit against other Go rate limiters and regenerates
#
#   docs/performance.txt            every pass's raw output (Go benchmark format)
#   docs/performance-benchstat.txt  benchstat's summary of it
#   docs/performance.md             the tables, goals and conditions
#   docs/performance.svg            the bar charts
#
# from the working tree (bench/go.mod replaces the library with ..).
#
# The run is PASSES passes of every benchmark, one after the other, rather
# than -count N of each in a row: a burst of other work on the machine then
# hits one pass of everything rather than every sample of one subject, and
# ratios are taken within each pass. Each pass runs the subjects in its own
# shuffled order (BENCH_ORDER), so no subject always follows the same one.
# It prints how long the passes took.
#
# Environment: PASSES (default 6, at least 6 for benchstat), BENCHTIME
# (default 300ms per benchmark), BENCH (a -bench regexp, default all),
# OUT (default ../docs).
set -euo pipefail
cd "$(dirname "$0")"

passes=${PASSES:-6}
benchtime=${BENCHTIME:-300ms}
bench=${BENCH:-.}
out=${OUT:-../docs}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== checking that every configuration takes the path its scenario claims"
go test -count=1 ./...

echo "== building the benchmarks"
go test -c -o "$tmp/bench.test" .

machine() {
	local model cores mem virt
	model=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null || true)
	cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?')
	mem=$(awk '/^MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo 2>/dev/null || true)
	virt=$(grep -q '^flags.* hypervisor' /proc/cpuinfo 2>/dev/null && echo ", virtual machine" || true)
	echo "${model:-unknown CPU}, ${cores} cores, ${mem:-? memory}${virt}"
}

# commit names the library's commit, and says so when the library's code
# (not its tests, docs or these benchmarks) differs from it.
commit() {
	local c
	c=$(git rev-parse --short HEAD 2>/dev/null) || { echo unknown; return; }
	if git status --porcelain -- .. 2>/dev/null | cut -c4- |
		grep -v -e '^bench/' -e '^docs/' -e '_test\.go$' | grep -q -e '\.go$' -e 'go\.mod$'; then
		c="$c with uncommitted changes to the library"
	fi
	echo "$c"
}

raw="$tmp/performance.txt"
{
	echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
	echo "commit: $(commit)"
	echo "go: $(go env GOVERSION)"
	echo "machine: $(machine)"
	echo "run: $passes passes, -benchtime $benchtime, GOMAXPROCS $(getconf _NPROCESSORS_ONLN)"
	echo "command: bench/run.sh"
} >"$raw"

start=$SECONDS
for p in $(seq 1 "$passes"); do
	echo "== pass $p of $passes ($((SECONDS - start)) s so far; load $(cut -d' ' -f1-3 /proc/loadavg))"
	{
		echo "pass: $p"
		echo "load: $(cut -d' ' -f1 /proc/loadavg)"
		BENCH_ORDER=$p "$tmp/bench.test" -test.run '^$' -test.bench "$bench" -test.benchtime "$benchtime" -test.count 1
	} >>"$raw"
done
echo "== $passes passes in $((SECONDS - start)) s"

cp "$raw" "$out/performance.txt"
go build -o "$tmp/benchstat" golang.org/x/perf/cmd/benchstat
(cd "$out" && "$tmp/benchstat" -ignore pass,load -row .fullname@alpha performance.txt >performance-benchstat.txt)
go run ./cmd/table -in "$out/performance.txt" -out "$out/performance.md"
go run ./cmd/chart -in "$out/performance.txt" -out "$out/performance.svg"
echo "== wrote $out/performance.md, performance.svg, performance.txt, performance-benchstat.txt"
