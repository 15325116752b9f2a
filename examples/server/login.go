package main

import (
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// loginConfig is what POST /login needs beyond the API's other routes: how
// a password is checked, and the clock its limits read (virtual time in
// tests).
type loginConfig struct {
	verify func(password string) bool
	clock  ratelimit.Clock
}

// passwordIs returns a check that accepts want alone, taking as long
// whatever it is given.
func passwordIs(want string) func(string) bool {
	return func(got string) bool { return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 }
}

// maxLoginForm bounds the body of a POST /login.
const maxLoginForm = 4 << 10

// login serves POST /login: a form field "password", right or wrong.
type login struct {
	verify  func(password string) bool
	key     httplimit.KeyFunc
	lockout *ratelimit.Lockout
	logger  *slog.Logger
}

// newLogin builds POST /login and describes its limits for GET /.
//
// A lockout alone would not do: it counts a failure once it has happened,
// so a burst of guesses sent at once would all be tried before the first
// counted. The sliding log charges every attempt before it is tried and
// gives back those that succeed (httplimit.WithCountOnly), so that the
// failures of the last minute and the attempts under way never come to
// more than 5, however many arrive at once.
func newLogin(cfg loginConfig, client httplimit.ClientIP, logTo httplimit.Option, logger *slog.Logger) (http.Handler, string, error) {
	// Per client address: failed logins only count, 5 a minute, and 5
	// within a minute lock the address out for 15 minutes.
	loginRule := ratelimit.SlidingLog{Limit: 5, Window: time.Minute, Name: "login"}
	lockoutRule := ratelimit.LockoutRule{Failures: 5, Within: time.Minute, Block: 15 * time.Minute, Name: "login-lockout"}
	clk := ratelimit.WithClock(cfg.clock)
	attempts, err := ratelimit.NewStore(loginRule, clk)
	if err != nil {
		return nil, "", err
	}
	lockout, err := ratelimit.NewLockout(lockoutRule, clk)
	if err != nil {
		return nil, "", err
	}
	l := &login{verify: cfg.verify, key: client.Key, lockout: lockout, logger: logger}
	failed := func(status int) bool { return status == http.StatusUnauthorized }
	limited := httplimit.Middleware(attempts, httplimit.WithKey(client.Key), logTo, httplimit.WithCountOnly(failed))
	desc := fmt.Sprintf("%q: failed logins only, sliding log, %d per %v, per client address; %d failures within %v lock the address out for %v",
		loginRule.Name, loginRule.Limit, loginRule.Window, lockoutRule.Failures, lockoutRule.Within, lockoutRule.Block)
	return l.lockedOut(limited(http.HandlerFunc(l.serve))), desc, nil
}

// lockedOut answers 429 to an address that is locked out, with the exact
// time left in Retry-After (in whole seconds, rounded up), before its
// request is counted or tried.
func (l *login) lockedOut(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := l.key(r)
		if err != nil { // the limit's middleware answers it
			next.ServeHTTP(w, r)
			return
		}
		d := l.lockout.Check(key)
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
// counts for nothing. (Successes do not reset the address's failures: a
// client that knows one password could then guess others for ever.)
func (l *login) serve(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginForm)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "malformed form: "+err.Error(), http.StatusBadRequest)
		return
	}
	if l.verify(r.PostForm.Get("password")) {
		reply(w, map[string]any{"ok": true})
		return
	}
	if key, err := l.key(r); err == nil {
		if d, started := l.lockout.Fail(key); started {
			l.logger.Info("locked out", "key", key, "for", d.RetryAfter)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": "wrong_password"})
}
