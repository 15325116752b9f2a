package load

import (
	"context"
	"regexp"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisStats is what INFO says a Redis server did between ResetStats and
// Read.
type RedisStats struct {
	CPU         time.Duration    // used_cpu_user + used_cpu_sys: all the server's work
	ScriptCalls int64            // EVALSHA and EVAL calls: the checks that reached Redis
	ScriptUsec  int64            // the time Redis spent running them (commandstats usec)
	Commands    map[string]int64 // calls per command, the scripts' own included
}

var (
	usedCPU = regexp.MustCompile(`used_cpu_(?:sys|user):([\d.]+)`)
	cmdstat = regexp.MustCompile(`cmdstat_([a-z|]+):calls=(\d+),usec=(\d+)`)
)

// Meter reads a Redis server's counters around a run.
type Meter struct {
	rdb *redis.Client
	cpu time.Duration
}

// StartMeter resets the command statistics (CONFIG RESETSTAT) and reads the
// CPU the server has used so far.
func StartMeter(ctx context.Context, rdb *redis.Client) (*Meter, error) {
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return nil, err
	}
	cpu, err := serverCPU(ctx, rdb)
	if err != nil {
		return nil, err
	}
	return &Meter{rdb: rdb, cpu: cpu}, nil
}

// Read returns what the server did since StartMeter. The INFO calls the
// meter makes itself are counted in Commands (as "info"), not in
// ScriptCalls.
func (m *Meter) Read(ctx context.Context) (RedisStats, error) {
	cpu, err := serverCPU(ctx, m.rdb)
	if err != nil {
		return RedisStats{}, err
	}
	info, err := m.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return RedisStats{}, err
	}
	s := RedisStats{CPU: cpu - m.cpu, Commands: map[string]int64{}}
	for _, sm := range cmdstat.FindAllStringSubmatch(info, -1) {
		n, _ := strconv.ParseInt(sm[2], 10, 64)
		s.Commands[sm[1]] = n
		if sm[1] == "evalsha" || sm[1] == "eval" {
			usec, _ := strconv.ParseInt(sm[3], 10, 64)
			s.ScriptCalls += n
			s.ScriptUsec += usec
		}
	}
	return s, nil
}

func serverCPU(ctx context.Context, rdb *redis.Client) (time.Duration, error) {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var sec float64
	for _, m := range usedCPU.FindAllStringSubmatch(info, 2) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sec += v
	}
	return time.Duration(sec * float64(time.Second)), nil
}
