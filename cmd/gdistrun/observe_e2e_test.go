//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/timeline"
)

// distChild is childMain's dist mode: a rank that joins the job with
// gdist.InitFromEnv (metrics and timeline from the environment), records
// the address its metrics endpoint bound in $GDISTRUN_TEST_DIR/metrics.RANK,
// runs a few collectives, and leaves once the file "scraped" appears there.
func distChild(dir, rank string) int {
	ctx := context.Background()
	pg, err := gdist.InitFromEnv(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, err)
		pg.Close()
		return 1
	}
	d := make([]float32, 64)
	for range 3 {
		if err := pg.AllReduce(ctx, dist.F32(d), dist.Sum); err != nil {
			return fail(err)
		}
	}
	if err := writeAtomic(filepath.Join(dir, "metrics."+rank), pg.MetricsAddr()); err != nil {
		return fail(err)
	}
	for deadline := time.Now().Add(childSleep); !exists(dir, "scraped"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("rank %s: never scraped", rank))
		}
	}
	if err := pg.Barrier(ctx); err != nil {
		return fail(err)
	}
	if err := pg.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// freePortPair returns a port p on loopback such that p and p+1 were both
// free a moment ago.
func freePortPair(t *testing.T) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		p := ln.Addr().(*net.TCPAddr).Port
		ln2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+1))
		ln.Close()
		if err == nil {
			ln2.Close()
			return p
		}
	}
	t.Fatal("no two consecutive free ports")
	return 0
}

// TestRunMetricsPerRank: with GDIST_METRICS_ADDR=127.0.0.1:P, two ranks on
// one host serve on P and P+1 (P + LOCAL_RANK), each logs the address it
// bound, and every rank's endpoint answers GET /metrics with gdist's
// series. The job also writes a timeline into a directory that does not
// exist yet, and logs in JSON (-log-format json): every line the ranks
// write on stderr is a JSON object.
func TestRunMetricsPerRank(t *testing.T) {
	cfg, dir := testJob(t, 2, "dist")
	base := freePortPair(t)
	tl := filepath.Join(dir, "out", "timeline.json")
	cfg.environ = append(cfg.environ, "GDIST_METRICS_ADDR=127.0.0.1:"+strconv.Itoa(base), "GDIST_TIMELINE="+tl)
	cfg.logFormat = "json"
	ch, stdout, stderr := runAsync(cfg)

	for r := range 2 {
		f := "metrics." + strconv.Itoa(r)
		require.Eventually(t, func() bool { return exists(dir, f) }, 30*time.Second, 10*time.Millisecond,
			"rank %d did not start serving; stderr:\n%s", r, stderr)
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		assert.Equal(t, "127.0.0.1:"+strconv.Itoa(base+r), string(b), "rank %d serves on base port + local rank", r)
		resp, err := http.Get("http://" + string(b) + "/metrics")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Contains(t, string(body), `gdist_collectives_total{op="all_reduce",rank="`+strconv.Itoa(r)+`"} 3`)
		assert.Contains(t, string(body), `gdist_world_size{rank="`+strconv.Itoa(r)+`"} 2`)
	}
	require.NoError(t, writeAtomic(filepath.Join(dir, "scraped"), ""))
	res := awaitRun(t, ch)
	require.NoError(t, res.err, "stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.Equal(t, 0, res.code)

	// Every rank's stderr line is a JSON record, and says where it served
	// and what it wrote; gdistrun's own note is JSON too.
	served := map[string]string{}
	wrote := map[string]string{}
	prefix := regexp.MustCompile(`^\[([01])\] `)
	for _, line := range strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n") {
		var rec map[string]any
		m := prefix.FindStringSubmatch(line)
		if m == nil {
			require.NoError(t, json.Unmarshal([]byte(line), &rec), "gdistrun's line %q", line)
			assert.Equal(t, "INFO", rec["level"])
			assert.Contains(t, rec["msg"], "gdistrun: GOMAXPROCS=")
			continue
		}
		require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, m[0])), &rec), "rank %s's line %q", m[1], line)
		assert.Contains(t, rec, "time")
		assert.Contains(t, rec, "level")
		switch rec["msg"] {
		case "dist: serving metrics":
			served[m[1]], _ = rec["addr"].(string)
		case "dist: wrote timeline":
			wrote[m[1]], _ = rec["path"].(string)
		}
	}
	for r := range 2 {
		rs := strconv.Itoa(r)
		assert.Equal(t, "http://127.0.0.1:"+strconv.Itoa(base+r)+"/metrics", served[rs], "rank %d logs the address it bound", r)
		p := timeline.RankPath(tl, r)
		assert.Equal(t, p, wrote[rs], "rank %d names the timeline it wrote", r)
		evs, err := timeline.ReadFile(p)
		require.NoError(t, err, "the timeline's directory was created")
		assert.NotEmpty(t, evs)
	}
}

// TestRunTimelineUnwritable: a timeline path under a regular file fails
// every rank at start, with an error naming the path, and the job exits
// non-zero.
func TestRunTimelineUnwritable(t *testing.T) {
	cfg, dir := testJob(t, 2, "dist")
	file := filepath.Join(dir, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	tl := filepath.Join(file, "timeline.json")
	cfg.environ = append(cfg.environ, "GDIST_TIMELINE="+tl)
	ch, _, stderr := runAsync(cfg)
	res := awaitRun(t, ch)
	require.Error(t, res.err)
	assert.NotEqual(t, 0, res.code)
	assert.Regexp(t, `\[[01]\] dist: rank [01]: timeline: cannot write `+regexp.QuoteMeta(filepath.Join(file, "timeline.rank"))+`[01]\.json: `, stderr.String())
}

// TestRunPassesRunIDAndLogFormat: --rdzv-id reaches the ranks as
// TORCHELASTIC_RUN_ID and -log-format as GDIST_LOG_FORMAT, over what
// gdistrun inherited; a bad inherited GDIST_LOG_FORMAT is refused.
func TestRunPassesRunIDAndLogFormat(t *testing.T) {
	cfg, _ := testJob(t, 2, "vars")
	cfg.environ = append(cfg.environ, "GDIST_LOG_FORMAT=text")
	cfg.runID, cfg.logFormat = "job42", "json"
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	require.Equal(t, 0, code)
	for _, r := range []string{"0", "1"} {
		assert.Contains(t, stdout.String(), "["+r+"] TORCHELASTIC_RUN_ID=job42 GDIST_LOG_FORMAT=json\n")
	}

	cfg.runID, cfg.logFormat = "", ""
	cfg.environ = append(cfg.environ, "GDIST_LOG_FORMAT=xml")
	code, err = run(context.Background(), cfg, &stdout, &stderr)
	require.ErrorIs(t, err, errUsage)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, err.Error(), `GDIST_LOG_FORMAT="xml": want text or json (or give -log-format)`)
}

// TestRunRedirects: --redirects 1 sends the ranks' stdout to the -log-dir
// files only; their stderr still reaches the terminal.
func TestRunRedirects(t *testing.T) {
	cfg, dir := testJob(t, 2, "vars")
	cfg.logDir, cfg.redirects = filepath.Join(dir, "logs"), 1
	var stdout, stderr bytes.Buffer
	code, err := run(context.Background(), cfg, &stdout, &stderr)
	require.NoError(t, err)
	require.Equal(t, 0, code)
	assert.Empty(t, stdout.String())
	for _, r := range []string{"0", "1"} {
		assert.Contains(t, stderr.String(), "["+r+"] to stderr\n")
		b, err := os.ReadFile(filepath.Join(cfg.logDir, "rank"+r+".log"))
		require.NoError(t, err)
		assert.Contains(t, string(b), "\nTORCHELASTIC_RUN_ID= GDIST_LOG_FORMAT=\n")
		assert.Contains(t, string(b), "\nto stderr\n")
	}
}

// TestLauncherMPIAndTorchrunSpellings: the real command takes mpirun's -np
// and a torchrun command line with a fixed-size --nnodes range, the c10d
// backend, a job id and --tee.
func TestLauncherMPIAndTorchrunSpellings(t *testing.T) {
	for _, args := range [][]string{
		{"-np", "2"},
		{"--nnodes=1:1", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-id=job7", "--tee", "3"},
	} {
		cmd, stdout, stderr := launcher(t, t.TempDir(), append(args, os.Args[0], childArg, "vars")...)
		require.NoError(t, cmd.Wait(), "%q: %s", args, stderr)
		for _, r := range []string{"0", "1"} {
			assert.Contains(t, stdout.String(), "["+r+"] TORCHELASTIC_RUN_ID=", "%q", args)
		}
		assert.NotContains(t, stdout.String(), "[2]")
	}
}
