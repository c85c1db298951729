package launch_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/launch"
)

// TestEnvNamesMatchDist: the variables the launcher sets are the ones
// dist.InitFromEnv reads.
func TestEnvNamesMatchDist(t *testing.T) {
	assert.Equal(t, dist.EnvRank, launch.EnvRank)
	assert.Equal(t, dist.EnvWorldSize, launch.EnvWorldSize)
	assert.Equal(t, dist.EnvLocalRank, launch.EnvLocalRank)
	assert.Equal(t, dist.EnvMasterAddr, launch.EnvMasterAddr)
	assert.Equal(t, dist.EnvMasterPort, launch.EnvMasterPort)
	assert.Equal(t, dist.EnvToken, launch.EnvToken)
}
