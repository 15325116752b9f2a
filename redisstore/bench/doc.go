// Package bench measures the Redis store beside other Go rate limiters that
// keep their state in Redis, in one run against one local redis-server that
// the benchmarks start themselves on a loopback port:
//
//   - github.com/go-redis/redis_rate/v10, GCRA in a Lua script;
//   - github.com/ulule/limiter/v3 with its Redis store, a fixed window
//     counted by INCRBY in a Lua script;
//   - redisstore, one rule of each algorithm, and a GCRA whose span is
//     beyond the fast path's range, so that its checks run on the exact
//     path.
//
// For each it reports checks per second from 64 goroutines, p50 and p99
// latency, the Redis CPU per check and the Redis commands per check (from
// INFO commandstats, reset with CONFIG RESETSTAT before each subject), and
// TestMemoryPerKey reports MEMORY USAGE of one key's state. It is a module
// of its own so that the peers never enter redisstore's dependencies.
//
//	cd redisstore/bench && go test -run TestMemoryPerKey -bench . -benchtime 40000x -v
//
// The module also holds the HTTP load runs: cmd/load starts a
// redis-server, three processes of redisstore/examples/server and one of
// examples/server on loopback ports and drives them with vegeta (package
// load is its harness); TestLoadSmoke is a 3-second run of it. Their
// figures are in docs/load.md.
//
//	cd redisstore/bench && go run ./cmd/load
package bench
