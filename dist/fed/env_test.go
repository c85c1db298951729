package fed

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist/internal/certs"
)

func lookupOf(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

// TestFromEnv: the launcher's variables make a Job whose Lead and Join
// form a federation over TLS; bad variables are errors naming them.
func TestFromEnv(t *testing.T) {
	ca, err := certs.NewCA("fed env test CA")
	require.NoError(t, err)
	leaf, err := ca.Issue("rank", "127.0.0.1")
	require.NoError(t, err)
	files, err := leaf.Write(t.TempDir())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	env := func(rank int, extra ...string) map[string]string {
		m := map[string]string{
			"RANK": strconv.Itoa(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": strconv.Itoa(port),
			"GDIST_TOKEN": "0123456789abcdef0123456789abcdef", "GDIST_TLS_CERT": files.Cert, "GDIST_TLS_KEY": files.Key,
			"GDIST_TLS_CA": files.CA, "GDIST_HEARTBEAT_TIMEOUT": "2s", "GDIST_INIT_TIMEOUT": "20s", "GDIST_TRANSPORT": "tcp",
		}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	j0, err := fromEnv(lookupOf(env(0)))
	require.NoError(t, err)
	j1, err := fromEnv(lookupOf(env(1)))
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:"+strconv.Itoa(port), j0.Addr)
	assert.Equal(t, 2, j1.World)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	joined := make(chan *Client, 1)
	go func() {
		c, err := j1.Join(ctx, WithLogger(quietLog()))
		assert.NoError(t, err)
		joined <- c
	}()
	l, err := j0.Lead(ctx, []float32{1, 2}, WithLogger(quietLog()))
	require.NoError(t, err)
	defer l.Close()
	c := <-joined
	require.NotNil(t, c)
	defer c.Close()
	m, _ := c.Model()
	assert.Equal(t, []float32{1, 2}, m)
	assert.Equal(t, []int{1}, l.Members())
	_, err = j1.Lead(ctx, nil)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	_, err = j0.Join(ctx)
	assert.ErrorIs(t, err, ErrInvalidArgument)

	for _, bad := range []struct{ name string }{
		{"GDIST_TOKEN"}, {"GDIST_HEARTBEAT_TIMEOUT"}, {"GDIST_TRANSPORT"}, {"GDIST_TLS_CA"}, {"GDIST_INIT_TIMEOUT"}, {"GDIST_MAX_FRAME"},
	} {
		value := map[string]string{"GDIST_TOKEN": "short", "GDIST_HEARTBEAT_TIMEOUT": "soon", "GDIST_TRANSPORT": "pigeon",
			"GDIST_TLS_CA": "", "GDIST_INIT_TIMEOUT": "-1s", "GDIST_MAX_FRAME": "lots"}[bad.name]
		_, err := fromEnv(lookupOf(env(1, bad.name, value)))
		require.ErrorIs(t, err, ErrEnv, bad.name)
		assert.ErrorContains(t, err, bad.name)
	}
	_, err = fromEnv(lookupOf(env(0, "WORLD_SIZE", "1")))
	assert.ErrorIs(t, err, ErrEnv)
	e := env(1)
	delete(e, "GDIST_TOKEN")
	_, err = fromEnv(lookupOf(e))
	assert.ErrorContains(t, err, "GDIST_TOKEN is not set")
	e["GDIST_INSECURE"] = "1"
	_, err = fromEnv(lookupOf(e))
	assert.NoError(t, err)
}
