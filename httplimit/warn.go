package httplimit

import (
	"hash/maphash"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
)

// WithWarnings sends the middleware's warnings about its configuration to
// l, at level Warn; a nil l turns them off. By default they go to the
// middleware's logger (see [WithLogger]), [slog.Default] unless set.
//
// Each warning is written once per process, whatever the number of
// requests or middlewares that see the cause, and never per request. The
// checks look at a sample of requests (one in 64), so they cost next to
// nothing, and warn:
//
//   - "httplimit: forwarded requests keyed by their peer", when a request
//     carries X-Forwarded-For or Forwarded and is keyed by the address of
//     the peer that sent it ([ClientIP] with no TrustedProxies, the
//     default key, or a peer it does not trust). Behind a reverse proxy
//     that means every client shares the proxy's limit: set
//     ClientIP.TrustedProxies to the proxy's network. A server reached
//     directly can ignore it: its clients wrote the header themselves.
//   - "httplimit: one address takes most requests, from many user
//     agents", when a single client address key takes at least half of
//     100 sampled requests, sent with at least 8 different User-Agent
//     values: the sign of many clients behind one proxy or NAT address
//     that share a limit.
func WithWarnings(l *slog.Logger) Option {
	return func(c *config) { c.warn, c.warnSet = l, true }
}

// warned records, for the whole process, which warnings have been
// written.
var warned struct {
	forwarded, shared atomic.Bool
}

// watchAll makes the checks look at every request, for tests; otherwise
// they look at one in watchEvery.
var watchAll atomic.Bool

const watchEvery = 64

const (
	watchWindow = 100 // sampled requests per verdict on shared keys
	watchAgents = 8   // distinct User-Agent values that make a key shared
	watchKeys   = 64  // keys followed per window; more are not counted
)

// watch runs the misconfiguration checks of one middleware.
type watch struct {
	log  *slog.Logger
	seed maphash.Seed

	mu   sync.Mutex
	n    int // requests sampled in the window
	keys map[string]*agents
}

// agents is what a window saw of one key: its requests and the distinct
// User-Agent values they carried (their hashes, up to watchAgents).
type agents struct {
	n    int
	seen [watchAgents]uint64
	k    int
}

func newWatch(l *slog.Logger) *watch {
	return &watch{log: l, seed: maphash.MakeSeed()}
}

// sampled reports whether this request is one the checks look at.
func (w *watch) sampled() bool {
	return rand.Uint32()%watchEvery == 0 || watchAll.Load()
}

// observe runs the checks on a sampled request r keyed by key.
func (w *watch) observe(r *http.Request, key string) {
	if !warned.forwarded.Load() &&
		(len(r.Header["X-Forwarded-For"]) > 0 || len(r.Header["Forwarded"]) > 0) &&
		keyedByPeer(r, key) && warned.forwarded.CompareAndSwap(false, true) {
		w.log.Warn("httplimit: forwarded requests keyed by their peer",
			slog.String("key", key),
			slog.String("advice", "requests carry X-Forwarded-For or Forwarded but are keyed by the address of the peer that sent them: "+
				"behind a reverse proxy every client shares the proxy's limit; set ClientIP.TrustedProxies to the proxy's network"))
	}
	if !warned.shared.Load() && strings.HasPrefix(key, "ip:") {
		w.count(key, r.Header.Get("User-Agent"))
	}
}

// count adds a sampled request of key to the window, and warns if the
// window, once full, shows one key taking most requests from many agents.
func (w *watch) count(key, ua string) {
	h := maphash.String(w.seed, ua)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.keys == nil {
		w.keys = make(map[string]*agents, watchKeys)
	}
	a := w.keys[key]
	if a == nil && len(w.keys) < watchKeys {
		a = new(agents)
		w.keys[key] = a
	}
	if a != nil {
		a.n++
		if a.k < watchAgents && !contains(a.seen[:a.k], h) {
			a.seen[a.k] = h
			a.k++
		}
	}
	if w.n++; w.n < watchWindow {
		return
	}
	for k, a := range w.keys {
		if 2*a.n >= w.n && a.k >= watchAgents && warned.shared.CompareAndSwap(false, true) {
			w.log.Warn("httplimit: one address takes most requests, from many user agents",
				slog.String("key", k), slog.Int("sampled", w.n), slog.Int("of_key", a.n),
				slog.String("advice", "many clients behind one proxy or NAT address share its limit; "+
					"behind a reverse proxy, set ClientIP.TrustedProxies so that each client is keyed by its own address"))
		}
	}
	w.n = 0
	clear(w.keys)
}

func contains(s []uint64, v uint64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// keyedByPeer reports whether key is the client address key of r's
// immediate peer: "ip:" and the peer's address, or a prefix holding it.
func keyedByPeer(r *http.Request, key string) bool {
	k, ok := strings.CutPrefix(key, "ip:")
	if !ok {
		return false
	}
	peer, ok := parsePeer(r.RemoteAddr)
	if !ok {
		return false
	}
	if strings.IndexByte(k, '/') >= 0 {
		p, err := netip.ParsePrefix(k)
		return err == nil && p.Contains(peer)
	}
	a, err := netip.ParseAddr(k)
	return err == nil && a == peer
}
