package frameworks

import (
	"net/http"

	"github.com/labstack/echo/v4"
)

// Echo returns an echo server whose routes are limited by mw, through
// echo's own WrapMiddleware. A request the middleware refuses is answered
// by it (429 with its fields and body) and never reaches echo's handler.
func Echo(mw func(http.Handler) http.Handler) http.Handler {
	e := echo.New()
	e.HideBanner = true
	e.Use(echo.WrapMiddleware(mw))
	e.GET("/hello", func(c echo.Context) error {
		return c.String(http.StatusOK, "hello")
	})
	return e
}
