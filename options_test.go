package gdist

import (
	"log/slog"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
)

// TestOptionsRefused: every invalid option, of InitFromEnv or of the group,
// makes InitFromEnv fail with an error matching ErrInvalidArgument that
// names it, and the first refusal wins.
func TestOptionsRefused(t *testing.T) {
	for _, tc := range []struct {
		opt  Option
		name string
	}{
		{WithGroupOptions(dist.WithTimeout(0)), "WithTimeout"},
		{WithGroupOptions(dist.WithTimeout(-time.Second)), "WithTimeout"},
		{WithGroupOptions(dist.WithSmallThreshold(-1)), "WithSmallThreshold"},
		{WithGroupOptions(dist.WithLogger(nil)), "WithLogger"},
		{WithGroupOptions(dist.WithLocalRank(-1)), "WithLocalRank"},
		{WithGroupOptions(nil), "WithGroupOptions: option 0 is nil"},
		{WithTCPOptions(nil), "WithTCPOptions: option 0 is nil"},
		{WithLogger(nil), "WithLogger(nil)"},
		{nil, "option 0 is nil"},
	} {
		clearEnv(t)
		_, err := InitFromEnv(bg, tc.opt)
		require.ErrorIs(t, err, ErrInvalidArgument, tc.name)
		require.ErrorIs(t, err, dist.ErrInvalidArgument, "one value")
		assert.Contains(t, err.Error(), tc.name)
	}
	clearEnv(t)
	_, err := InitFromEnv(bg, WithGroupOptions(dist.WithTimeout(time.Second)), WithGroupOptions(dist.WithSmallThreshold(-2), dist.WithTimeout(0)))
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "WithSmallThreshold(-2)")
	_, err = InitFromEnv(bg, WithTCPOptions(), WithLogger(nil), WithTCPOptions(nil))
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "WithLogger(nil)")
}

// TestOptionsRefusedBeforeConnecting: a bad group option fails InitFromEnv
// before the rendezvous, which here would wait for a rank that never comes.
func TestOptionsRefusedBeforeConnecting(t *testing.T) {
	clearEnv(t, EnvRank, "1", EnvWorldSize, "2", EnvMasterAddr, "127.0.0.1", EnvMasterPort, "1", EnvInsecure, "1")
	start := time.Now()
	_, err := InitFromEnv(bg, WithGroupOptions(dist.WithTimeout(0)))
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Less(t, time.Since(start), time.Second)
}

// TestGroupEnvOptions: GDIST_RESTART_COUNT, GDIST_METRICS_ADDR and the
// launcher's LOCAL_RANK reach the group; the caller's group options win
// over the environment's; a malformed count is refused naming it.
func TestGroupEnvOptions(t *testing.T) {
	clearEnv(t, EnvRestartCount, "3", EnvMetricsAddr, "127.0.0.1:0", EnvRank, "0", EnvWorldSize, "1", EnvLocalRank, "0")
	g, err := InitFromEnv(bg, WithLogger(slog.New(slog.DiscardHandler)))
	require.NoError(t, err)
	require.NotNil(t, g.Metrics())
	rec := httptest.NewRecorder()
	g.Metrics().Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	assert.Regexp(t, regexp.MustCompile(`(?m)^gdist_restarts(\{[^}]*\})? 3$`), rec.Body.String())
	assert.Equal(t, 0, g.LocalRank())
	require.NoError(t, g.Close())

	g, err = InitFromEnv(bg, WithGroupOptions(dist.WithLocalRank(5), dist.WithRestartCount(1)))
	require.NoError(t, err)
	assert.Equal(t, 5, g.LocalRank(), "the caller's option wins")
	require.NoError(t, g.Close())

	for _, v := range []string{"x", "-1"} {
		t.Setenv(EnvRestartCount, v)
		_, err = InitFromEnv(bg)
		require.ErrorIs(t, err, dist.ErrEnv)
		assert.Contains(t, err.Error(), EnvRestartCount)
	}
}
