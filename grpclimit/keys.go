package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// KeyFunc returns the key a call is limited by, such as the peer's address
// or an API key. fullMethod is the call's method, "/package.Service/Method",
// and md the call's incoming metadata (never nil; it must not be modified).
//
// An error matching [ErrNoKey] means the call lacks what it must be keyed
// by, which is the client's mistake: the call is refused with
// codes.Unauthenticated, whatever the [ErrorHandler]. A key function may
// also return a gRPC status error (from package status) to refuse the call
// with that status, such as codes.InvalidArgument for a malformed tenant
// field. Any other error means the call's limit cannot be checked; it goes
// to the ErrorHandler. So a key function that looks the key up with a gRPC
// call of its own should not return that call's status error as it is
// (with %w), which would go to the client: format it with %v instead, to
// leave the choice to the ErrorHandler.
type KeyFunc func(ctx context.Context, fullMethod string, md metadata.MD) (string, error)

// ErrNoKey is what a [KeyFunc] returns, wrapped with detail if it likes,
// for a call that does not carry what it is limited by, such as an API key
// that is required and missing. The interceptors refuse such a call with
// codes.Unauthenticated and never hand it to the [ErrorHandler]: under
// [FailOpen] a client could otherwise skip its limit by leaving the key out.
var ErrNoKey = errors.New("grpclimit: the call has no key")

// ErrNoPeerAddr is returned by [PeerAddr.Key] for a call whose peer has no
// IP address (a Unix socket's peer, an in-memory connection). It is a
// server-side condition, not the client's, so it goes to the
// [ErrorHandler].
var ErrNoPeerAddr = errors.New("grpclimit: the peer has no IP address")

// PeerAddr keys calls by the address of the connection's peer, taken from
// the call's [peer.Peer]. The peer is the immediate one: a server behind a
// proxy sees the proxy's address, and should key by what the proxy adds to
// the metadata instead, with a [KeyFunc] of its own. IPv4-mapped IPv6
// addresses are treated as the IPv4 addresses they carry, and zones are
// dropped.
//
// A PeerAddr is a plain value, safe for concurrent use. Its zero value is
// the interceptors' default key.
type PeerAddr struct {
	// IPv6Prefix is how many leading bits of an IPv6 peer address make its
	// key. One subscriber is usually given a whole /64, so keying by the
	// full address would hand each of them 2^64 allowances. 0 means 64;
	// other values are clamped to 1..128. IPv4 addresses are keyed whole.
	IPv6Prefix int
}

// Key returns the peer's address as a key: "ip:" and the address for IPv4,
// "ip:" and the masked prefix (such as "ip:2001:db8:1:2::/64") for IPv6,
// the keys httplimit's ClientIP makes, so that one store limits a client
// over HTTP and gRPC alike. It has the type of a [KeyFunc]; a peer without
// an IP address is an error matching [ErrNoPeerAddr].
func (p PeerAddr) Key(ctx context.Context, _ string, _ metadata.MD) (string, error) {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.Addr == nil {
		return "", fmt.Errorf("%w: the call carries no peer", ErrNoPeerAddr)
	}
	a, ok := addrOf(pr.Addr)
	if !ok {
		return "", fmt.Errorf("%w: %s peer %q", ErrNoPeerAddr, pr.Addr.Network(), pr.Addr.String())
	}
	return httplimit.AddrKey(a, p.IPv6Prefix), nil
}

// addrOf returns the IP address of a peer, unmapped and without its zone.
func addrOf(a net.Addr) (netip.Addr, bool) {
	var ip netip.Addr
	switch t := a.(type) {
	case *net.TCPAddr:
		var ok bool
		if ip, ok = netip.AddrFromSlice(t.IP); !ok {
			return netip.Addr{}, false
		}
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Addr{}, false
		}
		ip = ap.Addr()
	}
	return ip.Unmap().WithZone(""), true
}

// MetadataKey returns a [KeyFunc] keying calls by the first value of the
// metadata field name (such as "x-api-key"; gRPC metadata names are lower
// case, and name is lowered), and by fallback (often [PeerAddr.Key]) when
// the field is absent or empty. The key is "hdr:" and the first 16 bytes of
// the value's SHA-256 in hex, so that every key has the same small size
// however long the value, and secrets are neither held by the store nor
// logged. It is the key httplimit's HeaderKey makes for the same value, so
// one store gives an API key one allowance over HTTP and gRPC together.
//
// With a nil fallback the field is required: a call without it gets an
// error matching [ErrNoKey], which the interceptors answer with
// codes.Unauthenticated, so that leaving the key out is no way round the
// limit.
//
// The value is not authenticated: anyone may send any value. Check keys
// before limiting by them, or limit by peer address as well.
//
// MetadataKey panics if name is empty.
func MetadataKey(name string, fallback KeyFunc) KeyFunc {
	if name == "" {
		panic("grpclimit: MetadataKey with an empty name; name the metadata field that carries the key, such as \"x-api-key\"")
	}
	name = strings.ToLower(name)
	missing := fmt.Errorf("%w: the %s metadata field is missing", ErrNoKey, name)
	return func(ctx context.Context, method string, md metadata.MD) (string, error) {
		var v string
		if vs := md[name]; len(vs) > 0 {
			v = vs[0]
		}
		if v == "" {
			if fallback == nil {
				return "", missing
			}
			return fallback(ctx, method, md)
		}
		return httplimit.SecretKey(v), nil
	}
}

// MethodKey keys calls by their full method, "method:/package.Service/Method":
// one allowance per method shared by every client, to protect a backend
// from all of them at once. It has the type of a [KeyFunc].
func MethodKey(_ context.Context, fullMethod string, _ metadata.MD) (string, error) {
	return "method:" + fullMethod, nil
}

// PerMethod returns a [KeyFunc] that keys each call by key's key and the
// call's full method together, "<key> <full method>", so that a client has
// one allowance for each method rather than one for all of them. key's
// errors are returned as they are.
func PerMethod(key KeyFunc) KeyFunc {
	if key == nil {
		panic("grpclimit: PerMethod with a nil KeyFunc")
	}
	return func(ctx context.Context, fullMethod string, md metadata.MD) (string, error) {
		k, err := key(ctx, fullMethod, md)
		if err != nil {
			return "", err
		}
		return k + " " + fullMethod, nil
	}
}

// CostFunc returns what a call costs, such as 10*[ratelimit.Unit] for a
// bulk method. An error, a cost of zero or less, and a cost above the
// rule's capacity (a call that could never pass) are refused with
// codes.InvalidArgument, never codes.ResourceExhausted.
type CostFunc func(ctx context.Context, fullMethod string, md metadata.MD) (ratelimit.Units, error)

// FixedCost returns a [CostFunc] charging every call c.
func FixedCost(c ratelimit.Units) CostFunc {
	return func(context.Context, string, metadata.MD) (ratelimit.Units, error) { return c, nil }
}

// MethodCosts returns a [CostFunc] charging each full method
// ("/package.Service/Method") what costs gives it, and every other method
// def. The map is copied: changing it afterwards changes nothing.
func MethodCosts(costs map[string]ratelimit.Units, def ratelimit.Units) CostFunc {
	m := make(map[string]ratelimit.Units, len(costs))
	for k, v := range costs {
		m[k] = v
	}
	return func(_ context.Context, fullMethod string, _ metadata.MD) (ratelimit.Units, error) {
		if c, ok := m[fullMethod]; ok {
			return c, nil
		}
		return def, nil
	}
}
