package certs

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestIssue(t *testing.T) {
	ca, err := NewCA("test CA")
	require.NoError(t, err)
	leaf, err := ca.Issue("rank", "127.0.0.1", "node0.example")
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(leaf.der)
	require.NoError(t, err)
	for _, name := range []string{"127.0.0.1", "node0.example"} {
		_, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: name,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
		assert.NoError(t, err, name)
	}
	_, err = cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), DNSName: "elsewhere"})
	assert.Error(t, err)
	other, err := NewCA("test CA")
	require.NoError(t, err)
	_, err = cert.Verify(x509.VerifyOptions{Roots: other.Pool()})
	assert.Error(t, err, "another CA of the same name does not vouch for it")

	cfg := leaf.Config()
	assert.Equal(t, uint16(tls.VersionTLS13), cfg.MinVersion)
	require.Len(t, cfg.Certificates, 1)

	f, err := leaf.Write(t.TempDir())
	require.NoError(t, err)
	_, err = tls.LoadX509KeyPair(f.Cert, f.Key)
	require.NoError(t, err)
	st, err := os.Stat(f.Key)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the key is private")
	pem, err := os.ReadFile(f.CA)
	require.NoError(t, err)
	assert.Equal(t, ca.PEM(), pem)
}
