package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/ratekit/ratelimit/redisstore"
)

// maxLoginForm bounds the body of a POST /login.
const maxLoginForm = 4 << 10

// login serves POST /login: a form field "password", right or wrong.
type login struct {
	password string
	key      httplimit.KeyFunc
	lockout  *redisstore.Lockout
	a        *api
}

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
	loginRule := ratelimit.SlidingLog{Limit: 5, Window: time.Minute, Name: "login"}
	lockoutRule := ratelimit.LockoutRule{Failures: 5, Within: time.Minute, Block: 15 * time.Minute, Name: "login-lockout"}
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
	l := &login{password: a.cfg.password, key: client.Key, lockout: lockout, a: a}
	failed := func(status int) bool { return status == http.StatusUnauthorized }
	limited := httplimit.Middleware(&closedStore{attempts}, httplimit.WithKey(client.Key), logTo, httplimit.WithCountOnly(failed))
	a.loginL = fmt.Sprintf("%q: failed logins only, sliding log, %d per %v, per client address; %d failures within %v lock the address out for %v; in Redis",
		loginRule.Name, loginRule.Limit, loginRule.Window, lockoutRule.Failures, lockoutRule.Within, lockoutRule.Block)
	return l.lockedOut(limited(http.HandlerFunc(l.serve))), nil
}

// closedStore is the attempts' store, saying with -decided-by that its
// failure policy's answers are fail closed's.
type closedStore struct{ *redisstore.Store }

func (s *closedStore) CheckContext(ctx context.Context, key string, cost ratelimit.Units) (ratelimit.Decision, error) {
	d, err := s.Store.CheckContext(ctx, key, cost)
	markDecided(ctx, err, "fail-closed")
	return d, err
}

// lockedOut answers 429 to an address that is locked out on any replica,
// with the exact time left in Retry-After (in whole seconds, rounded up),
// before its request is counted or tried.
func (l *login) lockedOut(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := l.key(r)
		if err != nil { // the limit's middleware answers it
			next.ServeHTTP(w, r)
			return
		}
		d, err := l.lockout.Check(r.Context(), key)
		markDecided(r.Context(), err, "fail-closed")
		if err != nil {
			l.a.logger.Warn("lockout: its failure policy decided", "error", err)
		}
		if d.Allowed {
			next.ServeHTTP(w, r)
			return
		}
		secs := max(1, int64((d.RetryAfter+time.Second-1)/time.Second))
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(w).Encode(map[string]any{
			"error":          "locked_out",
			"policy":         d.Policy,
			"retry_after_ms": int64((d.RetryAfter + time.Millisecond - 1) / time.Millisecond),
			"message":        fmt.Sprintf("too many failed logins: try again in %v", d.RetryAfter.Round(time.Second)),
		})
	})
}

// serve checks the password. A wrong one is answered 401, counts against
// the address's attempts, and is a failure for its lockout; a right one
// counts for nothing.
func (l *login) serve(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginForm)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "malformed form: "+err.Error(), http.StatusBadRequest)
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("password")), []byte(l.password)) == 1 {
		reply(w, map[string]any{"ok": true})
		return
	}
	if key, err := l.key(r); err == nil {
		d, started, err := l.lockout.Fail(r.Context(), key)
		if err != nil {
			l.a.logger.Warn("lockout: a failure not counted in Redis", "error", err)
		}
		if started {
			l.a.logger.Info("locked out", "key", key, "for", d.RetryAfter)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": "wrong_password"})
}
