package ratelimit_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/ratekit/ratelimit"
)

const planDoc = `{
  "default": "free",
  "on_move": "additive",
  "plans": {
    "free": {"name": "free", "algorithm": "token_bucket", "rate": "10/s", "burst": 20},
    "trial": {"name": "trial", "algorithm": "sliding_log", "limit": 5, "window": "1m", "mode": "shadow"},
    "pro": {"layers": [
      {"name": "pro", "algorithm": "gcra", "rate": "100/s", "burst": 200},
      {"name": "all", "algorithm": "gcra", "rate": "1000/s", "burst": 2000, "key": "global"}
    ]}
  }
}`

func TestPlanSetJSON(t *testing.T) {
	var set ratelimit.PlanSet
	require.NoError(t, json.Unmarshal([]byte(planDoc), &set))
	assert.Equal(t, "free", set.Default)
	assert.Equal(t, ratelimit.MigrateAdditive, set.OnMove)
	assert.Equal(t, ratelimit.TokenBucket{Rate: ratelimit.PerSecond(10), Burst: 20, Name: "free"}, set.Plans["free"].Rule)
	trial := set.Plans["trial"]
	require.Len(t, trial.Layers, 1)
	assert.True(t, trial.Layers[0].Shadow)
	pro := set.Plans["pro"]
	require.Len(t, pro.Layers, 2)
	assert.Nil(t, pro.Layers[0].Key)
	require.NotNil(t, pro.Layers[1].Key)
	assert.Equal(t, ratelimit.GlobalKey("a"), pro.Layers[1].Key("b"))

	// The canonical form reads back to the same set, and writes the same.
	out, err := json.Marshal(set)
	require.NoError(t, err)
	var again ratelimit.PlanSet
	require.NoError(t, json.Unmarshal(out, &again), "%s", out)
	out2, err := json.Marshal(again)
	require.NoError(t, err)
	assert.Equal(t, string(out), string(out2))
	assert.Equal(t, set.Plans["free"], again.Plans["free"])

	// It builds.
	_, err = ratelimit.NewPlans(set, nil)
	require.NoError(t, err)
}

func TestPlanSetJSONErrorsNamePlanAndField(t *testing.T) {
	for _, c := range []struct{ name, doc, want string }{
		{"unknown top field", `{"default":"a","plans":{"a":{"algorithm":"gcra","rate":"1/s","burst":1}},"plan":{}}`, `plan is not a rule-set field`},
		{"no default plan", `{"default":"b","plans":{"a":{"algorithm":"gcra","rate":"1/s","burst":1}}}`, `"b" is not one of the plans`},
		{"bad rule", `{"default":"a","plans":{"a":{"algorithm":"gcra","rate":"1/s","burst":0}}}`, `plan "a"`},
		{"misspelt in a layer", `{"default":"a","plans":{"a":{"layers":[{"algorithm":"gcra","rate":"1/s","burst":1},{"algoritm":"gcra"}]}}}`, `layer 1`},
		{"bad key", `{"default":"a","plans":{"a":{"layers":[{"algorithm":"gcra","rate":"1/s","burst":1,"key":"ip"}]}}}`, `"request" or "global"`},
		{"bad on_move", `{"default":"a","on_move":"fresh","plans":{"a":{"algorithm":"gcra","rate":"1/s","burst":1}}}`, `on_move`},
		{"empty", `{"default":"a","plans":{}}`, `plans is empty`},
		{"layers and more", `{"default":"a","plans":{"a":{"layers":[{"algorithm":"gcra","rate":"1/s","burst":1}],"burst":2}}}`, `burst`},
		{"not an object", `[1]`, `must be an object`},
	} {
		t.Run(c.name, func(t *testing.T) {
			set := ratelimit.PlanSet{Default: "kept"}
			err := json.Unmarshal([]byte(c.doc), &set)
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			assert.Contains(t, err.Error(), c.want)
			assert.Equal(t, "kept", set.Default, "a refused document changes nothing")
		})
	}
}

func TestPlanSetJSONRefusesWhatItCannotHold(t *testing.T) {
	set := ratelimit.PlanSet{Default: "a", Plans: map[string]ratelimit.Plan{
		"a": {Layers: []ratelimit.Layer{{Rule: ratelimit.GCRA{Rate: ratelimit.PerSecond(1), Burst: 1}, Key: func(k string) string { return k }}}},
	}}
	_, err := json.Marshal(set)
	require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
	assert.Contains(t, err.Error(), "Key")
}

// TestPlanSetJSONRoundTrip: every set of valid rules reads back equal.
func TestPlanSetJSONRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		set := ratelimit.PlanSet{Plans: map[string]ratelimit.Plan{}, OnMove: ratelimit.Migration(rapid.IntRange(0, 3).Draw(t, "onMove"))}
		for i, n := 0, rapid.IntRange(1, 4).Draw(t, "plans"); i < n; i++ {
			name := rapid.String().Draw(t, "planName")
			if rapid.Bool().Draw(t, "layered") {
				var layers []ratelimit.Layer
				for j, m := 0, rapid.IntRange(1, 3).Draw(t, "layers"); j < m; j++ {
					spec := drawRuleSpec(t)
					l := ratelimit.Layer{Rule: spec.Rule, Shadow: spec.Shadow}
					if rapid.Bool().Draw(t, "global") {
						l.Key = ratelimit.GlobalKey
					}
					layers = append(layers, l)
				}
				set.Plans[name] = ratelimit.Plan{Layers: layers}
			} else {
				set.Plans[name] = ratelimit.Plan{Rule: drawRuleSpec(t).Rule}
			}
			set.Default = name
		}
		out, err := json.Marshal(set)
		if err != nil {
			// Only names JSON cannot carry as they are.
			require.ErrorIs(t, err, ratelimit.ErrInvalidRule)
			t.Skip("not valid UTF-8")
		}
		var got ratelimit.PlanSet
		require.NoError(t, json.Unmarshal(out, &got), "%s", out)
		out2, err := json.Marshal(got)
		require.NoError(t, err)
		require.Equal(t, string(out), string(out2))
		require.Len(t, got.Plans, len(set.Plans))
		for name, p := range set.Plans {
			g := got.Plans[name]
			if p.Rule != nil {
				require.Equal(t, p.Rule, g.Rule)
				continue
			}
			require.Len(t, g.Layers, len(p.Layers))
			for i := range p.Layers {
				require.Equal(t, p.Layers[i].Rule, g.Layers[i].Rule)
				require.Equal(t, p.Layers[i].Shadow, g.Layers[i].Shadow)
				require.Equal(t, p.Layers[i].Key == nil, g.Layers[i].Key == nil)
			}
		}
	})
}
