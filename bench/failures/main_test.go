//go:build unix

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/cli"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" { // a rank started by a test below
		err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
		os.Exit(cli.ExitCode("failures", errUsage, err, os.Stderr))
	}
	goleak.VerifyTestMain(m)
}

func TestLineRoundTrip(t *testing.T) {
	at := time.Unix(1764572059, 123456789)
	rep := report{Rank: 1, Type: typePeer, Peer: 2, Kind: kindLost, Iter: 57, At: at, Own: true, Canceled: true,
		Msg: `all_reduce: peer rank 2: "quoted" msg=x at=3`}
	ev, ok, err := parseLine(rep.String())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, event{What: "result", Rank: 1, At: at, Report: rep}, ev)

	ev, ok, err = parseLine(linePrefix + "ready rank=2")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, event{What: "ready", Rank: 2}, ev)

	ev, ok, err = parseLine(fmt.Sprintf("%sfault rank=0 at=%d", linePrefix, at.UnixNano()))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, event{What: "fault", Rank: 0, At: at}, ev)

	_, ok, err = parseLine("some other output")
	assert.NoError(t, err)
	assert.False(t, ok)
	for _, bad := range []string{
		linePrefix + "ready rank=x",
		linePrefix + "result rank=1 type=peer",
		linePrefix + `result rank=1 type=peer peer=2 kind=lost iter=1 at=5 msg="unterminated`,
		linePrefix + "bogus rank=1",
	} {
		_, ok, err := parseLine(bad)
		assert.True(t, ok, bad)
		assert.ErrorIs(t, err, errBadLine, bad)
	}
}

func TestClassify(t *testing.T) {
	desync := &dist.DesyncError{Rank: 0, Peer: 2, Seq: 6, PeerSeq: 6}
	for _, c := range []struct {
		err        error
		typ, kind  string
		peer       int
		shouldName string
	}{
		{nil, typeNone, kindNone, -1, "nil"},
		{&dist.PeerError{Rank: 2, Op: "all_reduce", Err: fmt.Errorf("%w: EOF", dist.ErrPeerLost)}, typePeer, kindLost, 2, "lost"},
		{&dist.PeerError{Rank: 1, Op: "all_reduce", Err: fmt.Errorf("%w: %w", dist.ErrPeerLost, tcp.ErrHeartbeatTimeout)}, typePeer, kindUnresponsive, 1, "heartbeat"},
		{&dist.PeerError{Rank: 1, Op: "recv", Err: dist.ErrPeerUnresponsive}, typePeer, kindUnresponsive, 1, "unresponsive"},
		{fmt.Errorf("ddp: %w", &dist.PeerError{Rank: 0, Err: dist.ErrPeerClosed}), typePeer, kindClosed, 0, "closed"},
		{&dist.PeerError{Rank: 0, Err: fmt.Errorf("%w by rank 0: x", dist.ErrAborted)}, typePeer, kindAborted, 0, "aborted"},
		{&dist.PeerError{Rank: 0, Err: fmt.Errorf("%w: bad", dist.ErrProtocol)}, typePeer, kindProtocol, 0, "protocol"},
		{fmt.Errorf("x: %w", desync), typeDesync, kindDesync, 2, "desync"},
		{fmt.Errorf("dist: all_reduce: %w", context.Canceled), typeCtx, kindCancelled, -1, "cancelled"},
		{fmt.Errorf("dist: all_reduce: %w", context.DeadlineExceeded), typeCtx, kindTimeout, -1, "timeout"},
		{fmt.Errorf("dist: all_reduce: %w", dist.ErrClosed), typeClosed, kindOther, -1, "group closed"},
		{errors.New("something else"), typeOther, kindOther, -1, "other"},
		// dist's failure domain: the first cause, its culprit and its kind,
		// whatever wraps it.
		{&dist.PeerError{Rank: 2, Op: "all_reduce", Err: &dist.AbortError{Kind: dist.KindFrozen, Rank: 2, Reporter: 0}}, typeAbort, kindUnresponsive, 2, "abort frozen"},
		{fmt.Errorf("ddp: %w", &dist.AbortError{Kind: dist.KindLost, Rank: 1, Reporter: 2}), typeAbort, kindLost, 1, "abort lost"},
		{&dist.AbortError{Kind: dist.KindCancelled, Rank: 0, Reporter: 0, Err: context.Canceled}, typeAbort, kindCancelled, 0, "abort cancelled"},
		{&dist.AbortError{Kind: dist.KindDesync, Rank: 2, Reporter: 0, Err: desync}, typeAbort, kindDesync, 2, "abort desync"},
		{&dist.AbortError{Kind: dist.KindClosed, Rank: 1}, typeAbort, kindClosed, 1, "abort closed"},
		{&dist.AbortError{Kind: dist.KindTimeout, Rank: 1}, typeAbort, kindTimeout, 1, "abort timeout"},
		{&dist.AbortError{Kind: dist.KindUser, Rank: 1}, typeAbort, kindUser, 1, "abort user"},
		{&dist.AbortError{Kind: dist.KindProtocol, Rank: 1}, typeAbort, kindProtocol, 1, "abort protocol"},
	} {
		typ, peer, kind := classify(c.err)
		assert.Equal(t, []any{c.typ, c.peer, c.kind}, []any{typ, peer, kind}, c.shouldName)
	}
}

func TestJudge(t *testing.T) {
	at := time.Unix(100, 0)
	rep := func(rank int, typ string, peer int, kind string, after time.Duration) report {
		return report{Rank: rank, Type: typ, Peer: peer, Kind: kind, At: at.Add(after)}
	}
	// kill of rank 1: both survivors name it.
	v := judge("kill", 0, []int{1}, at, map[int]report{
		0: rep(0, typePeer, 1, kindLost, 5*time.Millisecond),
		2: rep(2, typePeer, 1, kindLost, 9*time.Millisecond),
	})
	assert.Empty(t, v.Wrong)
	assert.Empty(t, v.Missing)
	assert.Equal(t, 9*time.Millisecond, v.Detect)
	// freeze of rank 0: rank 2 blames rank 1, which only closed after failing.
	v = judge("freeze", 0, []int{0}, at, map[int]report{
		1: rep(1, typePeer, 0, kindUnresponsive, 30*time.Second),
		2: rep(2, typePeer, 1, kindClosed, 30*time.Second),
	})
	assert.Len(t, v.Wrong, 1)
	assert.True(t, v.Healthy)
	// kill: the right rank, but as having closed cleanly, is the wrong cause.
	v = judge("kill", 0, []int{2}, at, map[int]report{
		0: rep(0, typePeer, 2, kindClosed, 0), 1: rep(1, typePeer, 2, kindLost, 0),
	})
	assert.Len(t, v.Wrong, 1)
	assert.False(t, v.Healthy, "rank 2 failed, if not the way it is reported")
	// desync: everyone must see the desync; a rank that saw the close is wrong.
	v = judge("desync", 0, []int{1}, at, map[int]report{
		0: rep(0, typeDesync, 1, kindDesync, 0), 1: rep(1, typeDesync, 0, kindDesync, 0),
		2: rep(2, typePeer, 1, kindClosed, 0),
	})
	assert.Len(t, v.Wrong, 1)
	// cancel of 0 and 1: own cancellation or the other's notice; the
	// bystander must get a notice from one of them, and rank 2 reported
	// nothing in time.
	v = judge("cancel", 0, []int{0, 1}, at, map[int]report{
		0: rep(0, typeCtx, -1, kindCancelled, 0), 1: rep(1, typePeer, 0, kindAborted, 0),
	})
	assert.Empty(t, v.Wrong)
	assert.Equal(t, []int{2}, v.Missing)
	v = judge("cancel", 0, []int{0, 1}, at, map[int]report{
		0: rep(0, typeAbort, 0, kindCancelled, 0), 1: rep(1, typeAbort, 1, kindCancelled, 0),
		2: rep(2, typePeer, 1, kindClosed, 0),
	})
	assert.Len(t, v.Wrong, 1, "rank 1 aborted with a notice: rank 2 must not take it for a close")
	v = judge("cancel", 0, []int{0, 1}, at, map[int]report{
		0: rep(0, typePeer, 2, kindAborted, 0), 1: rep(1, typeCtx, -1, kindCancelled, 0),
		2: rep(2, typeCtx, -1, kindCancelled, 0),
	})
	assert.Len(t, v.Wrong, 2, "rank 0 names the bystander; the bystander was not cancelled")
	// The same judgements on dist's *AbortError.
	v = judge("freeze", 0, []int{0}, at, map[int]report{
		1: rep(1, typeAbort, 0, kindUnresponsive, 0), 2: rep(2, typeAbort, 1, kindClosed, 0),
	})
	assert.Len(t, v.Wrong, 1)
	assert.True(t, v.Healthy)
	v = judge("cancel", 0, []int{1, 2}, at, map[int]report{
		0: rep(0, typeAbort, 1, kindCancelled, 0), 1: rep(1, typeAbort, 1, kindCancelled, 0),
		2: rep(2, typeCtx, -1, kindCancelled, 0),
	})
	assert.Empty(t, v.Wrong)
	v = judge("desync", 0, []int{0}, at, map[int]report{
		0: rep(0, typeAbort, 1, kindDesync, 0), 1: rep(1, typeDesync, 0, kindDesync, 0),
		2: rep(2, typeAbort, 0, kindLost, 0),
	})
	assert.Len(t, v.Wrong, 1, "a desync reported as a lost peer")

	// cancel-all: a call that saw its own context end must report it,
	// whatever notice came first; one that returned before may report a
	// peer's cancellation.
	own := func(r report, own, canceled bool) report { r.Own, r.Canceled = own, canceled; return r }
	all := victims("cancel-all", 7)
	assert.Equal(t, []int{0, 1, 2}, all)
	v = judge("cancel-all", 7, all, at, map[int]report{
		0: own(rep(0, typeAbort, 0, kindCancelled, 0), true, true),
		1: own(rep(1, typeAbort, 0, kindCancelled, 0), false, false),
		2: own(rep(2, typeAbort, 0, kindCancelled, 0), true, true),
	})
	assert.Empty(t, v.Wrong)
	v = judge("cancel-all", 7, all, at, map[int]report{
		0: own(rep(0, typeAbort, 0, kindCancelled, 0), true, true),
		1: own(rep(1, typeAbort, 0, kindCancelled, 0), true, false), // issue 21's defect
		2: own(rep(2, typePeer, 0, kindClosed, 0), false, false),
	})
	assert.Len(t, v.Wrong, 2, "rank 1 saw its context end but does not say so; rank 2 reports a close")
	// A victim whose next call was refused before it started (its context
	// ended between two all-reduces) aborted nothing: it left, and its
	// peers may only see it close.
	v = judge("cancel", 0, []int{0, 1}, at, map[int]report{
		0: rep(0, typeCtx, -1, kindCancelled, 0), 1: rep(1, typeCtx, -1, kindCancelled, 0),
		2: rep(2, typeAbort, 0, kindClosed, 0),
	})
	assert.Empty(t, v.Wrong)
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i))
	}
	assert.Equal(t, time.Duration(50), percentile(ds, 50))
	assert.Equal(t, time.Duration(99), percentile(ds, 99))
	assert.Equal(t, time.Duration(100), percentile(ds, 100))
	assert.Equal(t, time.Duration(1), percentile(ds[:1], 99))
	assert.Zero(t, percentile(nil, 50))
}

func TestFlags(t *testing.T) {
	var out bytes.Buffer
	for _, args := range [][]string{
		{"-scenarios", "kill,bogus"}, {"-n", "0"}, {"-count", "1"}, {"-parallel", "0"},
		{"-jitter", "-1s"}, {"-hogs", "-1"}, {"extra"}, {"-local", "-scenarios", "freeze"}, {"-local", "-soak", "1s"},
	} {
		err := run(context.Background(), args, &out, &out)
		assert.ErrorIs(t, err, errUsage, "%q", args)
	}
}

// tableRows parses the summary table: scenario -> its columns.
func tableRows(t *testing.T, out string) map[string][]string {
	rows := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 9 && !strings.HasPrefix(l, "#") && f[0] != "scenario" {
			rows[f[0]] = f
		}
	}
	return rows
}

// TestScenarios runs every scenario a few times on OS processes (the
// freeze once, with a 3 s heartbeat timeout where the transport reads
// GDIST_HEARTBEAT_TIMEOUT) and requires every run to be carried out, every
// rank to report and no rank to blame a healthy one.
func TestScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	for _, c := range []struct {
		scenarios string
		n         int
	}{{"kill,desync,cancel,cancel-all", 3}, {"freeze", 1}} {
		var out, errb bytes.Buffer
		args := []string{"-n", strconv.Itoa(c.n), "-scenarios", c.scenarios, "-count", "65536", "-heartbeat", "3s"}
		err := run(context.Background(), args, &out, &errb)
		t.Logf("%s\n%s", out.String(), errb.String())
		require.NoError(t, err)
		rows := tableRows(t, out.String())
		for _, sc := range strings.Split(c.scenarios, ",") {
			require.Contains(t, rows, sc)
			assert.Equal(t, []string{strconv.Itoa(c.n), "0", "0", "0"}, rows[sc][1:5], "%s: runs, wrong, healthy, no-report", sc)
		}
	}
}

// TestScenariosLocal runs the in-process scenarios a few times each.
func TestScenariosLocal(t *testing.T) {
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"-local", "-n", "5", "-count", "65536"}, &out, &errb)
	t.Logf("%s\n%s", out.String(), errb.String())
	require.NoError(t, err)
	rows := tableRows(t, out.String())
	for _, sc := range localScenarios {
		require.Contains(t, rows, sc)
		assert.Equal(t, []string{"5", "0", "0", "0"}, rows[sc][1:5], "%s: runs, wrong, healthy, no-report", sc)
	}
}

// TestSoak runs the soak for a few seconds with one CPU hog: no rank may
// fail.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	var out, errb bytes.Buffer
	err := run(context.Background(), []string{"-soak", "4s", "-hogs", "1", "-count", "65536"}, &out, &errb)
	t.Logf("%s\n%s", out.String(), errb.String())
	require.NoError(t, err)
	assert.Contains(t, out.String(), "false detections: 0 in")
	for r := range world {
		assert.Contains(t, out.String(), fmt.Sprintf("rank %d: ok: ", r))
	}
}
