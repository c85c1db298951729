package launch_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/internal/launch"
)

// TestEnvNamesMatchDist: the variables the launcher sets are the ones
// gdist.InitFromEnv reads.
func TestEnvNamesMatchDist(t *testing.T) {
	assert.Equal(t, gdist.EnvRank, launch.EnvRank)
	assert.Equal(t, gdist.EnvWorldSize, launch.EnvWorldSize)
	assert.Equal(t, gdist.EnvLocalRank, launch.EnvLocalRank)
	assert.Equal(t, gdist.EnvMasterAddr, launch.EnvMasterAddr)
	assert.Equal(t, gdist.EnvMasterPort, launch.EnvMasterPort)
	assert.Equal(t, gdist.EnvToken, launch.EnvToken)
}
