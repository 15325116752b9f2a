package ratelimit

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlanSetCloneSharesNothing: a clone's map and layer slices are its
// own, so that changing the caller's set leaves a kept clone as it was.
func TestPlanSetCloneSharesNothing(t *testing.T) {
	layer := Layer{Rule: GCRA{Rate: PerSecond(1), Burst: 1}}
	set := PlanSet{Plans: map[string]Plan{"a": {Layers: []Layer{layer, layer}}}, Default: "a"}
	kept := set.Clone()
	set.Plans["b"] = Plan{Rule: layer.Rule}
	set.Plans["a"].Layers[0] = Layer{Rule: FixedWindow{Limit: 9, Window: 1}}
	require.Len(t, kept.Plans, 1)
	require.Equal(t, layer, kept.Plans["a"].Layers[0])
}
