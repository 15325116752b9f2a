// Package exampleserver is what the example servers, examples/server and
// redisstore/examples/server, share: their -rules file, the description of
// a plan set for GET /, POST /login behind its lockout, the SIGHUP reload,
// and the serving and shutting down of the server.
//
// It lives in the core module, which every release publishes, so that
// redisstore's example server, a command users install at a version, finds
// it in the core module of that same version. It is a contract between
// two modules: a redisstore example of one release may be built against
// the core of a later one, so change what is here by adding, not by
// changing or removing.
package exampleserver

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// Main runs run with the program's arguments until SIGINT or SIGTERM,
// logging to standard error, and exits 1 if it fails (0 for -help).
func Main(run func(ctx context.Context, args []string, logw io.Writer, ready func(net.Addr)) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
}

// Route is one route of an API and the limit it is under, as GET / lists
// them.
type Route struct {
	Route string `json:"route"`
	Limit string `json:"limit"`
}

// RulesFile is the -rules file: plans, and the API keys on each.
type RulesFile struct {
	Rules ratelimit.PlanSet `json:"rules"`
	Keys  map[string]string `json:"keys"` // API key -> plan
}

// DefaultRules are the limits without -rules: one plan, "free", for every
// key.
func DefaultRules() RulesFile {
	return RulesFile{Rules: ratelimit.PlanSet{
		Plans: map[string]ratelimit.Plan{
			"free": {Rule: ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "api"}},
		},
		Default: "free",
	}}
}

// ReadRules reads and checks a -rules file, strictly: an unknown field, a
// malformed rule or a key on a plan that does not exist is an error.
func ReadRules(path string) (RulesFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return RulesFile{}, err
	}
	var rf RulesFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rf); err != nil {
		return RulesFile{}, err
	}
	if rf.Rules.Plans == nil {
		return RulesFile{}, errors.New(`"rules" is missing`)
	}
	for key, plan := range rf.Keys {
		if _, ok := rf.Rules.Plans[plan]; !ok {
			return RulesFile{}, fmt.Errorf("key %q is on plan %q, which is not one of the plans", key, plan)
		}
	}
	return rf, nil
}

// Plans describes the plans of set for GET /, in the order of their names:
// each name ("(default)" after the default's) and its JSON.
func Plans(set ratelimit.PlanSet) string {
	names := make([]string, 0, len(set.Plans))
	for name := range set.Plans {
		names = append(names, name)
	}
	sort.Strings(names)
	var plans []string
	for _, name := range names {
		spec, _ := json.Marshal(ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{name: set.Plans[name]}, Default: name})
		var doc struct{ Plans map[string]json.RawMessage }
		_ = json.Unmarshal(spec, &doc)
		label := name
		if name == set.Default {
			label += " (default)"
		}
		plans = append(plans, label+" "+string(doc.Plans[name]))
	}
	return strings.Join(plans, "; ")
}

// Flags are the flags both servers take.
type Flags struct {
	Addr      string         // -addr: where to listen
	Proxies   []netip.Prefix // -trust: the networks of trusted reverse proxies
	RulesPath string         // -rules: the file of plans and keys, or ""
	Rules     RulesFile      // read from -rules, or DefaultRules
	Password  string         // -password: what POST /login accepts
	Work      time.Duration  // -work: how long each quote takes

	fs    *flag.FlagSet
	trust string
}

// NewFlags makes a flag set for a server, logging to logw, with the flags
// both servers take; the caller adds its own, then calls Parse.
func NewFlags(logw io.Writer) (*Flags, *flag.FlagSet) {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(logw)
	f := &Flags{fs: fs}
	fs.StringVar(&f.Addr, "addr", "127.0.0.1:8080", "`address` to listen on")
	fs.StringVar(&f.trust, "trust", "", "comma-separated `networks` of trusted reverse proxies, such as 10.0.0.0/8")
	fs.StringVar(&f.RulesPath, "rules", "", "`file` of plans and the API keys on them (JSON); SIGHUP reads it again")
	fs.StringVar(&f.Password, "password", "letmein", "the `password` POST /login accepts")
	fs.DurationVar(&f.Work, "work", 0, "how long each quote takes (`duration`), to see its in-flight limit")
	return f, fs
}

// Parse parses args, refusing arguments after the flags, and reads -trust
// and -rules.
func (f *Flags) Parse(args []string) error {
	if err := f.fs.Parse(args); err != nil {
		return err
	}
	if f.fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", f.fs.Args())
	}
	for _, s := range strings.Split(f.trust, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("-trust: %w", err)
		}
		f.Proxies = append(f.Proxies, p.Masked())
	}
	f.Rules = DefaultRules()
	if f.RulesPath != "" {
		var err error
		if f.Rules, err = ReadRules(f.RulesPath); err != nil {
			return fmt.Errorf("-rules: %w", err)
		}
	}
	return nil
}

// ReloadOnHangup calls reload(path) at each SIGHUP until ctx ends, or
// never if path is "" (no -rules). The returned stop stops listening for
// SIGHUP.
func ReloadOnHangup(ctx context.Context, path string, reload func(path string)) (stop func()) {
	if path == "" {
		return func() {}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				reload(path)
			}
		}
	}()
	return func() { signal.Stop(hup) }
}

// LoginRules are POST /login's limits per client: failed logins only
// count, 5 a minute, and 5 within a minute lock the client out for 15
// minutes.
func LoginRules() (ratelimit.SlidingLog, ratelimit.LockoutRule) {
	return ratelimit.SlidingLog{Limit: 5, Window: time.Minute, Name: "login"},
		ratelimit.LockoutRule{Failures: 5, Within: time.Minute, Block: 15 * time.Minute, Name: "login-lockout"}
}

// LoginLimit describes the limits of LoginRules for GET /.
func LoginLimit() string {
	attempts, lockout := LoginRules()
	return fmt.Sprintf("%q: failed logins only, sliding log, %d per %v, per client address; %d failures within %v lock the address out for %v",
		attempts.Name, attempts.Limit, attempts.Window, lockout.Failures, lockout.Within, lockout.Block)
}

// LoginFailed says which answers of POST /login count against its
// attempts (httplimit.WithCountOnly): the 401 of a wrong password.
func LoginFailed(status int) bool { return status == http.StatusUnauthorized }

// maxLoginForm bounds the body of a POST /login.
const maxLoginForm = 4 << 10

// Login serves POST /login: a form field "password", right or wrong,
// behind a lockout per client.
type Login struct {
	Verify func(password string) bool // whether a password is right
	Key    httplimit.KeyFunc          // the client's key in the lockout
	// Check is the lockout's Decision for key, and Fail counts a failed
	// login of key, saying whether it locked key out (and for how long).
	Check  func(r *http.Request, key string) ratelimit.Decision
	Fail   func(r *http.Request, key string) (d ratelimit.Decision, started bool)
	Logger *slog.Logger
}

// PasswordIs returns a check that accepts want alone, taking as long
// whatever it is given.
func PasswordIs(want string) func(string) bool {
	return func(got string) bool { return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 }
}

// Handler is POST /login: a client that is locked out is answered 429,
// with the exact time left in Retry-After (in whole seconds, rounded up),
// before its request is counted or tried; then limited, the attempts'
// limit, wraps the check of the password.
func (l *Login) Handler(limited func(http.Handler) http.Handler) http.Handler {
	return l.lockedOut(limited(http.HandlerFunc(l.serve)))
}

func (l *Login) lockedOut(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := l.Key(r)
		if err != nil { // the limit's middleware answers it
			next.ServeHTTP(w, r)
			return
		}
		d := l.Check(r, key)
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
// the client's attempts, and is a failure for its lockout; a right one
// counts for nothing. (Successes do not reset the client's failures: a
// client that knows one password could then guess others for ever.)
func (l *Login) serve(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginForm)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "malformed form: "+err.Error(), http.StatusBadRequest)
		return
	}
	if l.Verify(r.PostForm.Get("password")) {
		Reply(w, map[string]any{"ok": true})
		return
	}
	if key, err := l.Key(r); err == nil {
		if d, started := l.Fail(r, key); started {
			l.Logger.Info("locked out", "key", key, "for", d.RetryAfter)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": "wrong_password"})
}

// Reply answers v as JSON.
func Reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// Working returns a wait for each request that takes d, or until the
// client goes away.
func Working(d time.Duration) func(*http.Request) {
	return func(r *http.Request) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
	}
}

// Serve serves h on addr until ctx ends, then shuts down, waiting up to
// 10 s for requests in flight. It logs to logger (the "listening" line
// with attrs added), and calls ready (if not nil) with the listening
// address once connections are accepted.
func Serve(ctx context.Context, addr string, h http.Handler, logger *slog.Logger, ready func(net.Addr), attrs ...any) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("listening", append([]any{"addr", ln.Addr().String()}, attrs...)...)
	if ready != nil {
		ready(ln.Addr())
	}

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	logger.Info("stopped")
	return nil
}

// PrintRoutes prints the routes and their limits, as a server does when it
// starts.
func PrintRoutes(w io.Writer, routes []Route) {
	fmt.Fprintln(w, "routes:")
	for _, r := range routes {
		fmt.Fprintf(w, "  %-20s %s\n", r.Route, r.Limit)
	}
}
