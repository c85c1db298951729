package main

import (
	"bytes"
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseArgs(t *testing.T) {
	var stdout, stderr bytes.Buffer
	cfg, err := parseArgs([]string{
		"-n", "4", "-nnodes", "2", "-node-rank", "1", "-master-addr", "host0",
		"-master-port", "29500", "-no-prefix", "-timeout", "1m", "-kill-grace", "500ms",
		"--", "./train", "-epochs", "3", "--", "x",
	}, &stdout, &stderr)
	require.NoError(t, err)
	assert.Equal(t, config{
		nproc: 4, nnodes: 2, nodeRank: 1, masterAddr: "host0", masterPort: 29500,
		noPrefix: true, timeout: time.Minute, killGrace: 500 * time.Millisecond,
		argv: []string{"./train", "-epochs", "3", "--", "x"},
	}, cfg)
	assert.Empty(t, stdout.String())
	assert.Empty(t, stderr.String())
}

func TestParseArgsDefaults(t *testing.T) {
	var out bytes.Buffer
	cfg, err := parseArgs([]string{"prog", "-n", "3"}, &out, &out)
	require.NoError(t, err)
	assert.Equal(t, config{
		nproc: 1, nnodes: 1, masterAddr: "127.0.0.1", killGrace: 3 * time.Second,
		argv: []string{"prog", "-n", "3"},
	}, cfg)

	cfg, err = parseArgs([]string{"--nproc-per-node", "2", "prog"}, &out, &out)
	require.NoError(t, err)
	assert.Equal(t, 2, cfg.nproc)
}

func TestParseArgsHelpAndErrors(t *testing.T) {
	var stdout, stderr bytes.Buffer
	_, err := parseArgs([]string{"-h"}, &stdout, &stderr)
	require.ErrorIs(t, err, flag.ErrHelp)
	assert.Contains(t, stdout.String(), "Usage: gdistrun")
	assert.Empty(t, stderr.String())

	stdout.Reset()
	_, err = parseArgs([]string{"-bogus"}, &stdout, &stderr)
	require.Error(t, err)
	assert.Empty(t, stdout.String())
	assert.Contains(t, stderr.String(), "-bogus")
	assert.Contains(t, stderr.String(), "gdistrun -h")

	stderr.Reset()
	assert.Equal(t, exitUsage, mainStatus([]string{"-n", "0", "true"}, nil, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "gdistrun: usage error: -n must be at least 1")
	assert.Equal(t, 0, mainStatus([]string{"-h"}, nil, &stdout, &stderr))
}

func TestUsage(t *testing.T) {
	var buf bytes.Buffer
	usage(&buf)
	u := buf.String()
	for _, want := range []string{
		"-n int", "-nnodes", "-node-rank", "-master-addr", "-master-port",
		"-no-prefix", "-timeout", "(default 3s)", "RANK", "LOCAL_WORLD_SIZE",
		"GDIST_TOKEN=<same>",
		"gdistrun -nnodes 2 -node-rank K -n 2 -master-addr HOST0 -master-port 29500 -- ./train",
		"GDIST_LISTEN_ADDR=0.0.0.0:0",
		"gdistrun -n 2 -- go run ./examples/mnist",
	} {
		assert.Contains(t, u, want)
	}
}
