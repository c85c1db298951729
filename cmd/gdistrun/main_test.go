package main

import (
	"bytes"
	"flag"
	"strings"
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

func TestParseArgsTimeouts(t *testing.T) {
	var out bytes.Buffer
	cfg, err := parseArgs([]string{"-heartbeat-timeout", "20s", "--init_timeout", "1m", "prog"}, &out, &out)
	require.NoError(t, err)
	assert.Equal(t, 20*time.Second, cfg.heartbeatTimeout)
	assert.Equal(t, time.Minute, cfg.initTimeout)
	_, err = parseArgs([]string{"-heartbeat-timeout", "soon", "prog"}, &out, &out)
	require.Error(t, err)
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
		"-n, -np, -nproc-per-node, -nproc_per_node int", "-nnodes", "-node-rank", "-master-addr", "-master-port",
		"-no-prefix", "-timeout", "(default 3s)", "RANK", "LOCAL_WORLD_SIZE",
		"GDIST_TOKEN=<same>",
		"gdistrun -nnodes 2 -node-rank K -n 2 -master-addr HOST0 -master-port 29500 -- ./train",
		"GDIST_LISTEN_ADDR=0.0.0.0:0",
		"gdistrun -n 2 -- go run ./examples/mnist",
	} {
		assert.Contains(t, u, want)
	}
}

func TestParseArgsTorchrunSpellings(t *testing.T) {
	for name, group := range map[string][][]string{
		"nproc": {
			{"-n", "2"}, {"--n=2"}, {"-nproc-per-node", "2"}, {"--nproc-per-node", "2"},
			{"--nproc_per_node=2"}, {"-nproc_per_node", "2"}, {"-n", "2", "--nproc_per_node", "2"},
			{"--standalone", "--nproc-per-node", "2"}, {"-n", "3", "-n", "2"},
		},
		"nodes": {
			{"-nnodes", "2", "-node-rank", "1", "-master-addr", "host0", "-master-port", "29500"},
			{"--nnodes=2", "--node_rank=1", "--master_addr=host0", "--master_port=29500"},
			{"--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "host0:29500"},
			{"--nnodes", "2", "--node_rank", "1", "--rdzv_endpoint=host0:29500", "--master-addr", "host0"},
			{"--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "host0:29500", "--master_port", "29500"},
		},
		"ipv6": {
			{"-master-addr", "::1", "-master-port", "29500"},
			{"--rdzv-endpoint", "[::1]:29500"},
		},
		"restarts": {
			{"-max-restarts", "3", "-log-dir", "logs"},
			{"--max_restarts=3", "--log_dir=logs"},
			{"--max-restarts", "3", "--log-dir", "logs"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			var want config
			for i, args := range group {
				var stdout, stderr bytes.Buffer
				cfg, err := parseArgs(append(args, "prog"), &stdout, &stderr)
				require.NoError(t, err, "%q: %s", args, stderr.String())
				assert.Empty(t, stderr.String())
				assert.Equal(t, []string{"prog"}, cfg.argv)
				if i == 0 {
					want = cfg
					continue
				}
				assert.Equal(t, want, cfg, "%q parses as %q", args, group[0])
			}
		})
	}
	var out bytes.Buffer
	cfg, err := parseArgs([]string{"--rdzv-endpoint", "host0:29500", "--max_restarts", "2", "prog"}, &out, &out)
	require.NoError(t, err)
	assert.Equal(t, "host0", cfg.masterAddr)
	assert.Equal(t, 29500, cfg.masterPort)
	assert.Equal(t, 2, cfg.maxRestarts)
}

func TestParseArgsConflicts(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in the message on stderr
	}{
		{[]string{"-n", "2", "--nproc_per_node", "3"}, "conflicts with -n=2"},
		{[]string{"--nproc-per-node=2", "-n", "3"}, "conflicts with -nproc-per-node=2"},
		{[]string{"--master-port", "1", "--master_port", "2"}, "conflicts with -master-port=1"},
		{[]string{"--node_rank", "1", "-node-rank", "0"}, "conflicts with -node_rank=1"},
		{[]string{"--max-restarts", "1", "--max_restarts", "2"}, "conflicts with -max-restarts=1"},
		{[]string{"--rdzv-endpoint", "h:29500", "-master-addr", "g"}, "-rdzv-endpoint=h:29500 conflicts with -master-addr=g"},
		{[]string{"--rdzv_endpoint", "h:29500", "--master_port", "1"}, "-rdzv_endpoint=h:29500 conflicts with -master_port=1"},
		{[]string{"--rdzv-endpoint", "h"}, "-rdzv-endpoint must be host:port"},
		{[]string{"--rdzv-endpoint", ":29500"}, "-rdzv-endpoint must be host:port"},
		{[]string{"--rdzv-endpoint", "h:0"}, "port must be in [1, 65535]"},
		{[]string{"--rdzv-endpoint", "h:http"}, "port must be in [1, 65535]"},
		{[]string{"--standalone", "--nnodes", "2"}, "-standalone is a single-node job; it conflicts with -nnodes=2"},
		{[]string{"--standalone", "--master-port", "29500"}, "it conflicts with -master-port"},
		{[]string{"--standalone", "--master_addr", "h"}, "it conflicts with -master_addr"},
		{[]string{"--standalone", "--rdzv-endpoint", "127.0.0.1:29500"}, "it conflicts with -rdzv-endpoint"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			_, err := parseArgs(append(tc.args, "prog"), &stdout, &stderr)
			require.Error(t, err)
			assert.Contains(t, stderr.String(), tc.want)
			assert.Contains(t, stderr.String(), "gdistrun -h")
			assert.Empty(t, stdout.String())
			stderr.Reset()
			assert.Equal(t, exitUsage, mainStatus(append(tc.args, "prog"), nil, &stdout, &stderr))
		})
	}
	var out bytes.Buffer
	_, err := parseArgs([]string{"--standalone", "--rdzv-endpoint", "h:1", "prog"}, &out, &out)
	require.ErrorIs(t, err, errUsage, "conflicts found after parsing are usage errors")
}

// Every spelling of a flag is listed on one line, once.
func TestUsageListsSpellingsCompactly(t *testing.T) {
	var buf bytes.Buffer
	usage(&buf)
	u := buf.String()
	for _, line := range []string{
		"  -n, -np, -nproc-per-node, -nproc_per_node int\n",
		"  -node-rank, -node_rank int\n",
		"  -master-addr, -master_addr string\n",
		"  -master-port, -master_port int\n",
		"  -rdzv-endpoint, -rdzv_endpoint host:port\n",
		"  -standalone\n",
		"  -max-restarts, -max_restarts N\n",
		"  -log-dir, -log_dir DIR\n",
		"  -kill-grace duration\n",
		"  -heartbeat-timeout, -heartbeat_timeout duration\n",
		"  -init-timeout, -init_timeout duration\n",
		"  -transport auto\n",
	} {
		assert.Equal(t, 1, strings.Count(u, line), "%q once in\n%s", line, u)
	}
	for _, alias := range []string{"-nproc_per_node", "-node_rank", "-master_port", "-rdzv_endpoint", "-max_restarts", "-log_dir"} {
		assert.Equal(t, 1, strings.Count(u, alias+" "), "%s listed once", alias)
	}
	assert.Contains(t, u, "GDIST_RESTART_COUNT")
	assert.Contains(t, u, "gdistrun: rank 1 failed (signal: killed); restart 1 of 2")
	assert.Contains(t, u, "DIR/rank<N>.log")
}

func TestProcsPerRank(t *testing.T) {
	for _, tc := range []struct{ cpus, n, want int }{
		{2, 2, 1}, {2, 4, 1}, {8, 2, 4}, {7, 2, 3}, {1, 1, 1}, {16, 1, 16}, {16, 3, 5},
	} {
		assert.Equal(t, tc.want, procsPerRank(tc.cpus, tc.n), "%d CPUs, %d ranks", tc.cpus, tc.n)
	}
	assert.Positive(t, availableCPUs())
}
