// Package frameworks shows httplimit's middleware in the routers most Go
// services use: chi, gin and echo. It is a module of its own, so that the
// library itself depends on none of them.
//
// chi and echo take net/http middleware as it is: chi's Use takes a
// func(http.Handler) http.Handler, and echo's WrapMiddleware turns one into
// an echo.MiddlewareFunc. gin needs the small adapter [Gin], which runs the
// rest of gin's chain as the handler the middleware forwards to, and stops
// the chain when the middleware answers the request itself.
//
// Each function builds a router with one route, GET /hello, behind a
// middleware mw such as
//
//	store, err := ratelimit.NewStore(ratelimit.GCRA{Rate: ratelimit.PerMinute(60), Burst: 10, Name: "api"})
//	...
//	mw := httplimit.Middleware(store)
//
// and the tests send real requests through each over loopback.
package frameworks
