package redisstore

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/*.lua from the scripts the code assembles")

// assembledScripts are the scripts the store loads that are assembled from
// several sources, by the file in testdata that holds each. ops.lua and
// lockout.lua are loaded as they are written.
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

// TestAssembledScripts checks that testdata holds each script exactly as
// the code assembles it, so that a maintainer can read the whole of what
// Redis runs, and a change to it shows in review. Run with -update to
// rewrite the files (go generate does).
func TestAssembledScripts(t *testing.T) {
	for name, src := range assembledScripts() {
		path := filepath.Join("testdata", name)
		if *update {
			require.NoError(t, os.WriteFile(path, []byte(src), 0o644))
			continue
		}
		got, err := os.ReadFile(path)
		require.NoError(t, err, "run go test -run TestAssembledScripts -update")
		assert.True(t, string(got) == src, "%s differs from the script the code assembles: run go test -run TestAssembledScripts -update", path)
	}
}
