package main

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/gdist/gdist/internal/launch"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

	assert.Len(t, j1.Token, 64)
	_, err = hex.DecodeString(j1.Token)
	assert.NoError(t, err, "token is hex")
	assert.NotEqual(t, j1.Token, j2.Token, "a fresh token per job")
	assert.Positive(t, j1.MasterPort)
	assert.Equal(t, 2, j1.WorldSize())
}

func TestResolveJobPassesTokenAndPortThrough(t *testing.T) {
	cfg := validConfig()
	cfg.masterPort = 29500
	j, err := resolveJob(cfg, []string{"GDIST_TOKEN=first", "GDIST_TOKEN=abc"})
	require.NoError(t, err)
	assert.Equal(t, "abc", j.Token)
	assert.Equal(t, 29500, j.MasterPort)
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
	assert.Equal(t, launch.Spec{NProc: 2, NNodes: 2, NodeRank: 1, MasterAddr: "127.0.0.1", MasterPort: 29500, Token: "abc"}, j)
	assert.Equal(t, 3, j.GlobalRank(1))
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
		"heartbeat<0":     func(c *config) { c.heartbeatTimeout = -time.Second },
		"heartbeat<10ms":  func(c *config) { c.heartbeatTimeout = time.Millisecond },
		"init<0":          func(c *config) { c.initTimeout = -time.Second },
		"transport=udp":   func(c *config) { c.transport = "udp" },
		"bind-to=socket":  func(c *config) { c.bindTo = "socket" },
		"max-restarts<0":  func(c *config) { c.maxRestarts = -1 },
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
