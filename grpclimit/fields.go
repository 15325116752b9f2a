package grpclimit

import (
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/ratekit/ratelimit"
	"github.com/ratekit/ratelimit/httplimit"
)

// Names of the metadata fields set on every checked call (see the package
// documentation).
const (
	PolicyField = "ratelimit-policy"
	LimitField  = "ratelimit"
)

// policyName names d's policy as the fields do: the rule's Name, or
// "default".
func policyName(d ratelimit.Decision) string {
	if d.Policy == "" {
		return "default"
	}
	return d.Policy
}

// fields returns the ratelimit-policy and ratelimit metadata for d and its
// layers (see checker.ask), as seen elapsed after the decision was made
// (an admitted call's Delay, which it has waited out).
func fields(d ratelimit.Decision, layers []ratelimit.Decision, elapsed time.Duration) metadata.MD {
	return metadata.MD{
		PolicyField: {string(httplimit.AppendPolicyList(make([]byte, 0, 64), d, layers))},
		LimitField:  {string(httplimit.AppendLimitList(make([]byte, 0, 64), d, layers, elapsed))},
	}
}

// policyValue is the ratelimit-policy field of d's rule alone, as httplimit
// sends it.
func policyValue(d ratelimit.Decision) string {
	return string(httplimit.AppendPolicyField(make([]byte, 0, len(d.Policy)+40), d))
}
