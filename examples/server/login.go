package main

import (
	"log/slog"
	"net/http"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
	"github.com/ratekit/ratelimit/internal/exampleserver"
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
func passwordIs(want string) func(string) bool { return exampleserver.PasswordIs(want) }

// newLogin builds POST /login and describes its limits for GET /.
//
// A lockout alone would not do: it counts a failure once it has happened,
// so a burst of guesses sent at once would all be tried before the first
// counted. The sliding log charges every attempt before it is tried and
// gives back those that succeed (httplimit.WithCountOnly), so that the
// failures of the last minute and the attempts under way never come to
// more than 5, however many arrive at once.
func newLogin(cfg loginConfig, client httplimit.ClientIP, logTo httplimit.Option, logger *slog.Logger) (http.Handler, string, error) {
	loginRule, lockoutRule := exampleserver.LoginRules()
	clk := ratelimit.WithClock(cfg.clock)
	attempts, err := ratelimit.NewStore(loginRule, clk)
	if err != nil {
		return nil, "", err
	}
	lockout, err := ratelimit.NewLockout(lockoutRule, clk)
	if err != nil {
		return nil, "", err
	}
	l := &exampleserver.Login{
		Verify: cfg.verify,
		Key:    client.Key,
		Check:  func(_ *http.Request, key string) ratelimit.Decision { return lockout.Check(key) },
		Fail:   func(_ *http.Request, key string) (ratelimit.Decision, bool) { return lockout.Fail(key) },
		Logger: logger,
	}
	limited := httplimit.Middleware(attempts, httplimit.WithKey(client.Key), logTo, httplimit.WithCountOnly(exampleserver.LoginFailed))
	return l.Handler(limited), exampleserver.LoginLimit(), nil
}
