package launch

import (
	"encoding/hex"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// envMap turns name=value entries into a map; later entries win.
func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestSpecEnvSingleNode(t *testing.T) {
	base := []string{"PATH=/bin", "RANK=99", "GDIST_TOKEN=old", "HOME=/root", "MASTER_PORT=1"}
	baseCopy := append([]string(nil), base...)
	s := Spec{NProc: 4, NNodes: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Token: "tok"}
	for local := range 4 {
		env := s.Env(base, local)
		m := envMap(env)
		assert.Equal(t, map[string]string{
			"PATH": "/bin", "HOME": "/root",
			"RANK": strconv.Itoa(local), "LOCAL_RANK": strconv.Itoa(local),
			"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4",
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
			"GDIST_TOKEN": "tok",
		}, m)
		assert.Len(t, env, len(m), "no duplicate variables")
	}
	assert.Equal(t, baseCopy, base, "base not modified")
}

func TestSpecEnvMultiNode(t *testing.T) {
	s := Spec{NProc: 2, NNodes: 3, NodeRank: 2, MasterAddr: "10.0.0.1", MasterPort: 1234, Token: "shared"}
	var ranks []string
	for local := range 2 {
		m := envMap(s.Env(nil, local))
		ranks = append(ranks, m["RANK"])
		assert.Equal(t, strconv.Itoa(local), m["LOCAL_RANK"])
		assert.Equal(t, "6", m["WORLD_SIZE"])
		assert.Equal(t, "2", m["LOCAL_WORLD_SIZE"])
		assert.Equal(t, "10.0.0.1", m["MASTER_ADDR"])
		assert.Equal(t, "1234", m["MASTER_PORT"])
		assert.Equal(t, "shared", m["GDIST_TOKEN"])
	}
	assert.Equal(t, []string{"4", "5"}, ranks)
	assert.Equal(t, 5, s.GlobalRank(1))
}

func TestResolveDefaults(t *testing.T) {
	a, err := Spec{NProc: 2}.Resolve()
	require.NoError(t, err)
	b, err := Spec{NProc: 2}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, 1, a.NNodes)
	assert.Equal(t, "127.0.0.1", a.MasterAddr)
	assert.Len(t, a.Token, 64)
	_, err = hex.DecodeString(a.Token)
	assert.NoError(t, err, "token is hex")
	assert.NotEqual(t, a.Token, b.Token, "a fresh token per launch")
	assert.Positive(t, a.MasterPort)

	c, err := Spec{NProc: 1, MasterPort: 29500, Token: "given"}.Resolve()
	require.NoError(t, err)
	assert.Equal(t, 29500, c.MasterPort)
	assert.Equal(t, "given", c.Token)
}

func TestFreePortFallsBack(t *testing.T) {
	p, err := FreePort("192.0.2.1") // TEST-NET-1: not an address of this host
	require.NoError(t, err)
	assert.Positive(t, p)
}

func TestResolveRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		s     Spec
		field string
	}{
		"n=0":        {Spec{}, "NProc"},
		"nnodes<0":   {Spec{NProc: 1, NNodes: -1}, "NNodes"},
		"node-rank":  {Spec{NProc: 1, NNodes: 2, NodeRank: 2, MasterPort: 1, Token: "t"}, "NodeRank"},
		"port":       {Spec{NProc: 1, MasterPort: 70000}, "MasterPort"},
		"multi-port": {Spec{NProc: 1, NNodes: 2, Token: "t"}, "MasterPort"},
		"multi-tok":  {Spec{NProc: 1, NNodes: 2, MasterPort: 29500}, "Token"},
	} {
		_, err := tc.s.Resolve()
		var se *SpecError
		require.ErrorAs(t, err, &se, name)
		assert.Equal(t, tc.field, se.Field, name)
		assert.ErrorIs(t, err, ErrJob, name)
	}
}
