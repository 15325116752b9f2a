package redisstore

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// assembledScripts are the scripts the store loads that are assembled from
// several sources, by name. ops.lua and lockout.lua are loaded as they are
// written.
func assembledScripts() map[string]string {
	return map[string]string{
		"step.lua":          stepSource,
		"step_function.lua": stepLibrary,
		"layers.lua":        layersScriptSource,
		"settle.lua":        settleSource,
		"inflight.lua":      inflightSource,
		"inflight_rate.lua": inflightWithSource,
	}
}

// TestScriptNamesExpanded checks that every name the sources give a value
// of the table (ALG_<lua>, ARG_<name>) is one the table has: expandLua
// leaves any other as it is, and Redis would fail on it only when a
// request reaches it.
func TestScriptNamesExpanded(t *testing.T) {
	for name, src := range assembledScripts() {
		assert.Empty(t, luaName.FindAllString(src, -1), "%s: names the table does not have", name)
	}
}
