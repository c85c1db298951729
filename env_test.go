package gdist

import (
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/hybrid"
	"github.com/gdist/gdist/internal/launchenv"
)

// clearEnv unsets every variable InitFromEnv reads, for the test's
// duration, then sets the key/value pairs kv.
func clearEnv(t *testing.T, kv ...string) {
	for _, v := range launchenv.RankVars() {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	for _, v := range []string{EnvMasterAddr, EnvMasterPort, EnvToken, EnvInsecure, EnvListenAddr,
		EnvHeartbeatTimeout, EnvHeartbeatInterval, EnvInitTimeout, EnvMaxFrame, EnvSocketBuffer,
		EnvTransport, EnvHostID, EnvTimeline, EnvMetricsAddr, EnvRestartCount,
		EnvTLSCert, EnvTLSKey, EnvTLSCA, EnvTLSServerName} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		t.Setenv(kv[i], kv[i+1])
	}
}

func TestInitFromEnvSingleProcess(t *testing.T) {
	for _, env := range []map[string]string{
		{},
		{"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"},
		{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},
		{"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0"},
	} {
		clearEnv(t)
		for k, v := range env {
			t.Setenv(k, v)
		}
		g, err := InitFromEnv(bg)
		require.NoError(t, err, "%v", env)
		assert.Equal(t, 0, g.Rank())
		assert.Equal(t, 1, g.WorldSize())
		assert.IsType(t, &transport.Local{}, g.Transport())
		d := []float32{1, 2}
		require.NoError(t, g.AllReduce(bg, dist.F32(d), dist.Mean))
		assert.Equal(t, []float32{1, 2}, d)
		require.NoError(t, g.Close())
	}
}

// TestInitFromEnvTCPWorldOne: with MASTER_ADDR a world of one still goes
// through the TCP rendezvous.
func TestInitFromEnvTCPWorldOne(t *testing.T) {
	tcpWorldOne(t)
	g, err := InitFromEnv(bg)
	require.NoError(t, err)
	assert.IsType(t, &hybrid.Transport{}, g.Transport())
	require.NoError(t, g.Barrier(bg))
	require.NoError(t, g.Close())
}

func TestInitFromEnvErrors(t *testing.T) {
	cases := []struct {
		env  map[string]string
		name string // the variable the error must name
	}{
		{map[string]string{"RANK": "0"}, "WORLD_SIZE"},
		{map[string]string{"RANK": "x", "WORLD_SIZE": "2"}, "RANK"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE"},
		{map[string]string{"RANK": "2", "WORLD_SIZE": "2"}, "RANK"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}, "MASTER_PORT"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"}, "MASTER_PORT"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "GDIST_TOKEN"},
		{map[string]string{"OMPI_COMM_WORLD_RANK": "1"}, "OMPI_COMM_WORLD_SIZE"},
		{map[string]string{"SLURM_PROCID": "3", "SLURM_NTASKS": "2"}, "SLURM_PROCID"},
	}
	for _, c := range cases {
		clearEnv(t)
		for k, v := range c.env {
			t.Setenv(k, v)
		}
		_, err := InitFromEnv(bg)
		require.ErrorIs(t, err, dist.ErrEnv, "%v", c.env)
		assert.Contains(t, err.Error(), c.name, "%v", c.env)
	}
	clearEnv(t)
	_, err := InitFromEnv(bg, WithGroupOptions(dist.WithTimeout(-1)))
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// TestInitFromEnvErrorNamesVariable: a malformed launcher variable gives an
// error matching dist.ErrEnv that names it (the launcher rules themselves are
// tested in internal/launchenv).
func TestInitFromEnvErrorNamesVariable(t *testing.T) {
	clearEnv(t, "SLURM_PROCID", "1", "SLURM_NTASKS", "2", "SLURM_STEP_NODELIST", "node[1-")
	_, err := InitFromEnv(bg)
	require.ErrorIs(t, err, dist.ErrEnv)
	var le *launchenv.Error
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "SLURM_STEP_NODELIST", le.Var)

	clearEnv(t, "OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "4", "OMPI_COMM_WORLD_LOCAL_SIZE", "2")
	_, err = InitFromEnv(bg)
	require.ErrorIs(t, err, dist.ErrEnv)
	assert.Contains(t, err.Error(), "MASTER_ADDR")
}

// TestEnvMetricsAddrPerRank: GDIST_METRICS_ADDR's port is moved by the
// local rank, so that the ranks of one host do not collide.
func TestEnvMetricsAddrPerRank(t *testing.T) {
	for local, want := range []string{"127.0.0.1:9464", "127.0.0.1:9465"} {
		addr, err := envMetricsAddr(lookupOf(EnvMetricsAddr, "127.0.0.1:9464",
			EnvRank, strconv.Itoa(local), EnvWorldSize, "2", EnvLocalRank, strconv.Itoa(local)))
		require.NoError(t, err)
		assert.Equal(t, want, addr, "local rank %d", local)
	}
	addr, err := envMetricsAddr(lookupOf())
	require.NoError(t, err)
	assert.Empty(t, addr, "unset")
	clearEnv(t, EnvMetricsAddr, "9464")
	_, err = groupEnvOptions(os.LookupEnv)
	require.ErrorIs(t, err, dist.ErrEnv)
	assert.Contains(t, err.Error(), EnvMetricsAddr)
	_, err = InitFromEnv(bg)
	require.ErrorIs(t, err, dist.ErrEnv)
}
