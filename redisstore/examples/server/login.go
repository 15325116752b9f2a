package main

import (
	"context"
	"net/http"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/ratekit/ratelimit/internal/exampleserver"
	"github.com/ratekit/ratelimit/redisstore"
)

// newLogin builds POST /login, and sets the API's clock (the limits') and
// the description of the route for GET /.
//
// A lockout alone would not do: it counts a failure once it has happened,
// so a burst of guesses sent at once would all be tried before the first
// counted. The sliding log charges every attempt before it is tried and
// gives back those that succeed (httplimit.WithCountOnly), so that the
// failures of the last minute and the attempts under way never come to
// more than 5, however many arrive at once, on however many replicas.
// Both fail closed: a login gate that opens when Redis is down would let
// guesses through that nobody counts.
func (a *api) newLogin(client httplimit.ClientIP, logTo httplimit.Option) (http.Handler, error) {
	loginRule, lockoutRule := exampleserver.LoginRules()
	attempts, err := redisstore.New(a.rdb, loginRule, append([]redisstore.Option{redisstore.WithFailureMode(redisstore.FailClosed),
		redisstore.WithDenyCache(a.cfg.denyCache)}, a.opts...)...)
	if err != nil {
		return nil, err
	}
	a.clock = attempts.Clock()
	lockout, err := redisstore.NewLockout(a.rdb, lockoutRule, a.opts...) // fails closed by default
	if err != nil {
		return nil, err
	}
	l := &exampleserver.Login{
		Verify: exampleserver.PasswordIs(a.cfg.password),
		Key:    client.Key,
		Check: func(r *http.Request, key string) ratelimit.Decision {
			d, err := lockout.Check(r.Context(), key)
			markDecided(r.Context(), err, "fail-closed")
			if err != nil {
				a.logger.Warn("lockout: its failure policy decided", "error", err)
			}
			return d
		},
		Fail: func(r *http.Request, key string) (ratelimit.Decision, bool) {
			d, started, err := lockout.Fail(r.Context(), key)
			if err != nil {
				a.logger.Warn("lockout: a failure not counted in Redis", "error", err)
			}
			return d, started
		},
		Logger: a.logger,
	}
	limited := httplimit.Middleware(&closedStore{attempts}, httplimit.WithKey(client.Key), logTo, httplimit.WithCountOnly(exampleserver.LoginFailed))
	a.loginL = exampleserver.LoginLimit() + "; in Redis"
	return l.Handler(limited), nil
}

// closedStore is the attempts' store, saying with -decided-by that its
// failure policy's answers are fail closed's.
type closedStore struct{ *redisstore.Store }

func (s *closedStore) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	d, err := s.Store.CheckContext(ctx, key, cost)
	markDecided(ctx, err, "fail-closed")
	return d, err
}
