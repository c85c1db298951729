package gdist

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/internal/certs"
)

// TestInitFromEnvTLS: with GDIST_TLS_CERT, _KEY and _CA the ranks meet and
// talk over TLS; a partial set, or a file that cannot be loaded, is an
// error matching dist.ErrEnv that names the variables.
func TestInitFromEnvTLS(t *testing.T) {
	ca, err := certs.NewCA("gdist env test CA")
	require.NoError(t, err)
	leaf, err := ca.Issue("rank", "127.0.0.1")
	require.NoError(t, err)
	f, err := leaf.Write(t.TempDir())
	require.NoError(t, err)

	clearEnv(t, EnvInsecure, "1", EnvTLSCert, f.Cert, EnvTLSKey, f.Key, EnvTLSCA, f.CA, EnvTransport, "tcp")
	ts, errs := dialPair(t, config{})
	for r := range 2 {
		require.NoError(t, errs[r], "rank %d", r)
		defer ts[r].Close()
	}
	require.NoError(t, ts[1].Send(bg, 0, 1, transport.Header{}, []byte("over tls")))
	m, err := ts[0].Recv(bg, 1, 1)
	require.NoError(t, err)
	assert.Equal(t, "over tls", string(m.Payload))

	clearEnv(t, EnvInsecure, "1", EnvTLSCert, f.Cert, EnvTLSKey, f.Key)
	_, errs = dialPair(t, config{})
	require.ErrorIs(t, errs[0], dist.ErrEnv)
	assert.ErrorContains(t, errs[0], EnvTLSCA)

	missing := filepath.Join(t.TempDir(), "nope.pem")
	clearEnv(t, EnvInsecure, "1", EnvTLSCert, f.Cert, EnvTLSKey, f.Key, EnvTLSCA, missing)
	_, errs = dialPair(t, config{})
	require.ErrorIs(t, errs[0], dist.ErrEnv)
	assert.ErrorContains(t, errs[0], missing)
}
