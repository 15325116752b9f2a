// This module is not published: it holds the tools and tests of the release
// scripts beside it (modproxy, the module proxy on disk that
// scripts/publish-check fills), and is never tagged.
module github.com/ratekit/ratelimit/scripts

go 1.26.0

require golang.org/x/mod v0.43.0
