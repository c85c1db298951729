package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/disttest"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/transporttest"
	"github.com/gdist/gdist/internal/cli"
)

// TestMain doubles as a rank: launch re-executes the test binary with the
// job in the environment.
func TestMain(m *testing.M) {
	if spec, ok := os.LookupEnv(envJob); ok {
		if err := rankMain(context.Background(), spec, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func TestLimitRate(t *testing.T) {
	ts := transporttest.NewLocal(t, 2)
	defer ts[0].Close()
	defer ts[1].Close()
	l, err := limit(ts[0], 10e6) // 10 MB/s
	require.NoError(t, err)
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		for range 4 {
			m, err := ts[1].Recv(ctx, 0, 1)
			if err != nil {
				done <- err
				return
			}
			ts[1].Release(m.Payload)
		}
		done <- nil
	}()
	p := make([]byte, 250_000)
	start := time.Now()
	for range 4 {
		require.NoError(t, l.Send(ctx, 1, 1, transport.Header{}, p))
	}
	took := time.Since(start)
	require.NoError(t, <-done)
	// 1 MB at 10 MB/s: 100 ms (the upper bound only catches a limiter
	// far off its rate, so that a loaded machine does not fail the test).
	assert.GreaterOrEqual(t, took, 95*time.Millisecond)
	assert.Less(t, took, 2*time.Second)

	// Sends to self are not limited: 20 MB would take 2 s at the rate.
	start = time.Now()
	require.NoError(t, l.Send(ctx, 0, 2, transport.Header{}, make([]byte, 20_000_000)))
	assert.Less(t, time.Since(start), time.Second)
	m, err := ts[0].Recv(ctx, 0, 2)
	require.NoError(t, err)
	ts[0].Release(m.Payload)

	_, err = limit(ts[0], 0)
	assert.Error(t, err)
}

func TestLimitCancel(t *testing.T) {
	ts := transporttest.NewLocal(t, 2)
	defer ts[0].Close()
	defer ts[1].Close()
	l, err := limit(ts[0], 1e3) // 1 kB/s: a 1 MB send would take 1000 s
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = l.Send(ctx, 1, 1, transport.Header{}, make([]byte, 1_000_000))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), time.Second)
}

// runRanks runs fn on n in-process ranks.
func runRanks(t *testing.T, n int, wrap func(transport.Transport) transport.Transport, fn func(pg *dist.ProcessGroup) error) {
	t.Helper()
	ts := make([]transport.Transport, n)
	for r, tr := range transporttest.NewLocal(t, n) {
		ts[r] = tr
		if wrap != nil {
			ts[r] = wrap(tr)
		}
	}
	errs := disttest.Run(t, disttest.Groups(t, ts, dist.WithTimeout(time.Minute)), func(_ int, pg *dist.ProcessGroup) error {
		return fn(pg)
	})
	require.NoError(t, errors.Join(errs...))
}

func TestRunJobInProcess(t *testing.T) {
	base := job{Sizes: []int{20, 32, 32, 5}, Batch: 8, Steps: 4, Warmup: 2, BucketCap: 4 * (32*32 + 32), FirstBucketCap: 4 * (32*5 + 5)}
	off, upfront, f16 := base, base, base
	off.NoOverlap = true
	upfront.Upfront = true
	f16.Compress = "f16"
	for name, j := range map[string]job{"overlap": base, "no-overlap": off, "upfront": upfront, "f16": f16} {
		t.Run(name, func(t *testing.T) {
			outs := make([]outcome, 2)
			var mu sync.Mutex
			limited := func(tr transport.Transport) transport.Transport {
				l, err := limit(tr, 1e9)
				require.NoError(t, err)
				return l
			}
			runRanks(t, 2, limited, func(pg *dist.ProcessGroup) error {
				o, err := runJob(context.Background(), pg, j)
				mu.Lock()
				outs[pg.Rank()] = o
				mu.Unlock()
				return err
			})
			params := 20*32 + 32 + 32*32 + 32 + 32*5 + 5
			for r, o := range outs {
				assert.Equal(t, r, o.Rank)
				assert.Equal(t, 2, o.World)
				assert.Equal(t, params, o.Params)
				assert.Equal(t, 3, o.Buckets, "rank %d", r)
				wire := int64(4 * params)
				if j.Compress != "" {
					wire /= 2
				}
				assert.Equal(t, wire, o.Bytes)
				assert.Positive(t, o.Elapsed)
				assert.Positive(t, o.Compute)
				assert.Positive(t, o.Comm)
				assert.LessOrEqual(t, o.Exposed, o.Elapsed)
			}
		})
	}
	t.Run("plain", func(t *testing.T) {
		j := base
		j.Plain = true
		runRanks(t, 1, nil, func(pg *dist.ProcessGroup) error {
			o, err := runJob(context.Background(), pg, j)
			assert.Zero(t, o.Buckets)
			assert.Zero(t, o.Comm)
			return err
		})
		runRanks(t, 2, nil, func(pg *dist.ProcessGroup) error {
			_, err := runJob(context.Background(), pg, j)
			assert.Error(t, err, "plain needs one rank")
			return nil
		})
	})
}

// TestLaunch runs a tiny job as two processes over TCP, with the raw-socket
// baseline, the way the benchmark does.
func TestLaunch(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	j := job{Name: "t", Sizes: []int{20, 16, 5}, Batch: 4, Steps: 3, Warmup: 1, Raw: true, LinkMBps: 500}
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := startRanks(ctx, 2, 1, false, j, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Len(t, r, 2)
	for i, o := range r {
		assert.Equal(t, i, o.Rank)
		assert.Equal(t, 1, o.Procs, "GOMAXPROCS reaches the rank")
		assert.Equal(t, 3, o.Steps)
	}
	require.NotNil(t, r[0].Raw)
	assert.Positive(t, r[0].Raw.StreamGBps)
	assert.Positive(t, r[0].Raw.ExchangeMs)
	assert.Positive(t, r.throughput(4))

	// A failing rank fails the launch instead of hanging.
	bad := j
	bad.Steps = 0
	_, err = startRanks(ctx, 2, 1, false, bad, &stderr)
	assert.Error(t, err)
}

// TestLaunchShm runs a tiny job as two processes over shared memory:
// every rank reports the transport that ran.
func TestLaunchShm(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the shared-memory transport needs Linux")
	}
	j := job{Name: "t", Sizes: []int{20, 16, 5}, Batch: 4, Steps: 3, Warmup: 1, Raw: true, Transport: "shm"}
	var stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := startRanks(ctx, 2, 1, false, j, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Len(t, r, 2)
	for _, o := range r {
		assert.Equal(t, "shm: shm to 1 peer", o.Transport)
		assert.Equal(t, 3, o.Steps)
	}
	require.NotNil(t, r[0].Raw)
	assert.Positive(t, r.throughput(4))
}

func TestBenchFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-transport", "udp"},
		{"-part", "both"},
		{"-link", "fast"},
		{"-link", "400,-1"},
		{"-procs", "0"},
		{"extra"},
	} {
		var stdout, stderr bytes.Buffer
		err := benchMain(context.Background(), args, &stdout, &stderr)
		assert.ErrorIs(t, err, errUsage, "%q", args)
		assert.Equal(t, 2, cli.ExitCode("bench/ddp", errUsage, err, &stderr), "%q", args)
		assert.Empty(t, stdout.String(), "%q: nothing runs", args)
	}
}

// TestHelp: -h and -help print the usage and exit 0.
func TestHelp(t *testing.T) {
	for _, h := range []string{"-h", "-help"} {
		var stdout, stderr bytes.Buffer
		err := program(context.Background(), []string{h}, &stdout, &stderr)
		assert.Equal(t, 0, cli.ExitCode("bench/ddp", errUsage, err, &stderr), h)
		assert.Contains(t, stderr.String(), "-overlap-steps int", h)
		assert.Empty(t, stdout.String(), "%s runs nothing", h)
	}
}
