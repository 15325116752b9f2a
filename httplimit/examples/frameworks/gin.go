package frameworks

import (
	"context"
	"net/http"

	"github.com/gin-gonic/gin"
)

// GinRouter returns a gin engine whose routes are limited by mw, through
// [Gin].
func GinRouter(mw func(http.Handler) http.Handler) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(Gin(mw))
	r.GET("/hello", func(c *gin.Context) {
		c.String(http.StatusOK, "hello")
	})
	return r
}

// Gin adapts net/http middleware, such as httplimit.Middleware's, to gin:
// the rest of gin's chain runs as the handler mw forwards to, with the
// request mw forwarded (httplimit.InFlight's carries the slot the request
// holds), and the chain stops when mw answers the request itself, as it
// does a request over its limit.
//
// The middleware is built once; each request carries its gin.Context to
// it in the request's context.
func Gin(mw func(http.Handler) http.Handler) gin.HandlerFunc {
	h := mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		call := r.Context().Value(ginCallKey{}).(*ginCall)
		call.forwarded = true
		call.c.Request = r
		call.c.Next()
	}))
	return func(c *gin.Context) {
		call := &ginCall{c: c}
		h.ServeHTTP(c.Writer, c.Request.WithContext(context.WithValue(c.Request.Context(), ginCallKey{}, call)))
		if !call.forwarded {
			c.Abort()
		}
	}
}

// ginCall is one request's passage through Gin's middleware.
type ginCall struct {
	c         *gin.Context
	forwarded bool
}

type ginCallKey struct{}
