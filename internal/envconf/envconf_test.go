package envconf

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func env(kv ...string) Lookup {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestDurationAndSize(t *testing.T) {
	d, ok, err := Duration(env("X", "1m30s"), "X")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, 90*time.Second, d)
	_, ok, err = Duration(env("X", ""), "X")
	assert.False(t, ok)
	assert.NoError(t, err)
	for _, bad := range []string{"soon", "-1s", "0s"} {
		_, _, err = Duration(env("X", bad), "X")
		var e *Error
		require.True(t, errors.As(err, &e), bad)
		assert.Equal(t, "X", e.Var)
		assert.EqualError(t, err, `X="`+bad+`" is not a positive duration (e.g. 10s)`)
	}
	n, ok, err := Size(env("S", "64M"), "S")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, 64<<20, n)
	_, _, err = Size(env("S", "lots"), "S")
	assert.ErrorContains(t, err, `S="lots" is not a positive size`)
}

func TestHeartbeat(t *testing.T) {
	_, _, ok, err := Heartbeat(env(), 8*time.Second)
	assert.False(t, ok)
	assert.NoError(t, err)
	i, to, ok, err := Heartbeat(env(HeartbeatTimeout, "3s"), 8*time.Second)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, time.Duration(0), i, "derived by the transport")
	assert.Equal(t, 3*time.Second, to)
	i, to, _, err = Heartbeat(env(HeartbeatInterval, "2s"), 8*time.Second)
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, i)
	assert.Equal(t, 8*time.Second, to, "the default timeout")
	_, _, _, err = Heartbeat(env(HeartbeatTimeout, "3s", HeartbeatInterval, "2s"), 8*time.Second)
	assert.ErrorContains(t, err, "must be at least twice "+HeartbeatInterval)
}

func TestTLS(t *testing.T) {
	_, ok, err := TLS(env())
	assert.False(t, ok)
	assert.NoError(t, err)
	f, ok, err := TLS(env(TLSCert, "c", TLSKey, "k", TLSCA, "a", TLSServerName, "job"))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, TLSFiles{Cert: "c", Key: "k", CA: "a", ServerName: "job"}, f)
	_, _, err = TLS(env(TLSCert, "c", TLSKey, "k"))
	assert.ErrorContains(t, err, TLSCA+`="" is not set`)
	_, _, err = TLS(env(TLSServerName, "job"))
	assert.ErrorContains(t, err, "is set without")
}
