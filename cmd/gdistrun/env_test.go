package main

import (
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

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

func TestRankEnvSingleNode(t *testing.T) {
	base := []string{"PATH=/bin", "RANK=99", "GDIST_TOKEN=old", "HOME=/root", "MASTER_PORT=1"}
	baseCopy := append([]string(nil), base...)
	j := jobEnv{nproc: 4, nnodes: 1, masterAddr: "127.0.0.1", masterPort: 29500, token: "tok"}
	for local := range 4 {
		env := rankEnv(base, j, local)
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

func TestRankEnvMultiNode(t *testing.T) {
	j := jobEnv{nproc: 2, nnodes: 3, nodeRank: 2, masterAddr: "10.0.0.1", masterPort: 1234, token: "shared"}
	var ranks []string
	for local := range 2 {
		m := envMap(rankEnv(nil, j, local))
		ranks = append(ranks, m["RANK"])
		assert.Equal(t, strconv.Itoa(local), m["LOCAL_RANK"])
		assert.Equal(t, "6", m["WORLD_SIZE"])
		assert.Equal(t, "2", m["LOCAL_WORLD_SIZE"])
		assert.Equal(t, "10.0.0.1", m["MASTER_ADDR"])
		assert.Equal(t, "1234", m["MASTER_PORT"])
		assert.Equal(t, "shared", m["GDIST_TOKEN"])
	}
	assert.Equal(t, []string{"4", "5"}, ranks)
}

func validConfig() config {
	return config{
		nproc: 2, nnodes: 1, masterAddr: "127.0.0.1",
		killGrace: time.Second, argv: []string{"true"},
	}
}

func TestResolveJobGeneratesTokenAndPort(t *testing.T) {
	j1, err := resolveJob(validConfig(), []string{"PATH=/bin"})
	require.NoError(t, err)
	j2, err := resolveJob(validConfig(), nil)
	require.NoError(t, err)

	assert.Len(t, j1.token, 64)
	_, err = hex.DecodeString(j1.token)
	assert.NoError(t, err, "token is hex")
	assert.NotEqual(t, j1.token, j2.token, "a fresh token per job")
	assert.Positive(t, j1.masterPort)
	assert.Equal(t, 2, j1.worldSize())
}

func TestResolveJobPassesTokenAndPortThrough(t *testing.T) {
	cfg := validConfig()
	cfg.masterPort = 29500
	j, err := resolveJob(cfg, []string{"GDIST_TOKEN=first", "GDIST_TOKEN=abc"})
	require.NoError(t, err)
	assert.Equal(t, "abc", j.token)
	assert.Equal(t, 29500, j.masterPort)
}

func TestResolveJobMultiNode(t *testing.T) {
	cfg := validConfig()
	cfg.nnodes, cfg.nodeRank = 2, 1

	_, err := resolveJob(cfg, []string{"GDIST_TOKEN=abc"})
	require.ErrorIs(t, err, errNeedPort)
	require.ErrorIs(t, err, errUsage)

	cfg.masterPort = 29500
	_, err = resolveJob(cfg, []string{"GDIST_TOKEN="})
	require.ErrorIs(t, err, errNeedToken)

	j, err := resolveJob(cfg, []string{"GDIST_TOKEN=abc"})
	require.NoError(t, err)
	assert.Equal(t, jobEnv{nproc: 2, nnodes: 2, nodeRank: 1, masterAddr: "127.0.0.1", masterPort: 29500, token: "abc"}, j)
	assert.Equal(t, 3, j.globalRank(1))
}

func TestResolveJobRejects(t *testing.T) {
	for name, mutate := range map[string]func(*config){
		"n=0":             func(c *config) { c.nproc = 0 },
		"nnodes=0":        func(c *config) { c.nnodes = 0 },
		"node-rank<0":     func(c *config) { c.nodeRank = -1 },
		"node-rank=nodes": func(c *config) { c.nodeRank = 1 },
		"port<0":          func(c *config) { c.masterPort = -1 },
		"port>65535":      func(c *config) { c.masterPort = 70000 },
		"empty addr":      func(c *config) { c.masterAddr = "" },
		"timeout<0":       func(c *config) { c.timeout = -time.Second },
		"grace<0":         func(c *config) { c.killGrace = -time.Second },
		"no program":      func(c *config) { c.argv = nil },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := validConfig()
			mutate(&cfg)
			_, err := resolveJob(cfg, nil)
			require.ErrorIs(t, err, errUsage)
		})
	}
}

func TestFreePortFallsBack(t *testing.T) {
	p, err := freePort("192.0.2.1") // TEST-NET-1: not an address of this host
	require.NoError(t, err)
	assert.Positive(t, p)
}
