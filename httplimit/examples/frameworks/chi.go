package frameworks

import (
	"io"
	"net/http"

	"github.com/go-chi/chi/v5"
)

// Chi returns a chi router whose routes are limited by mw: chi's
// middleware is net/http's, so mw goes to Use as it is (or to With, for
// one route or group).
func Chi(mw func(http.Handler) http.Handler) http.Handler {
	r := chi.NewRouter()
	r.Use(mw)
	r.Get("/hello", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "hello")
	})
	return r
}
