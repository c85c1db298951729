package dist

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/gdist/gdist/dist/transport/transporttest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTimeoutNamesStraggler: rank 2 stops after collective #1; the others'
// collective #2 times out on rank 0 (WithTimeout), whose error names rank 2
// and where it was, and rank 1, told by rank 0, names rank 2 too.
func TestTimeoutNamesStraggler(t *testing.T) {
	c := newCluster(t, 3, withProgressInterval(10*time.Millisecond))
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error {
		return g.AllReduce(bg, F32(make([]float32, 8)), Sum)
	}))
	time.Sleep(50 * time.Millisecond) // the ranks hear of each other's #1
	errs := c.run(func(r int, g *ProcessGroup) error {
		switch r {
		case 0:
			ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
			defer cancel()
			return g.AllReduce(ctx, F32(make([]float32, 8)), Sum)
		case 1:
			return g.AllReduce(bg, F32(make([]float32, 8)), Sum)
		}
		return nil
	})
	var te *TimeoutError
	require.ErrorAs(t, errs[0], &te)
	require.ErrorIs(t, errs[0], context.DeadlineExceeded)
	require.ErrorIs(t, errs[0], ErrTimeout)
	assert.Equal(t, "all_reduce", te.Op)
	assert.Equal(t, uint64(2), te.Seq)
	require.Len(t, te.Waiting, 1)
	assert.Equal(t, 2, te.Waiting[0].Rank)
	assert.Equal(t, uint64(1), te.Waiting[0].FinishedSeq)
	assert.Equal(t, "all_reduce", te.Waiting[0].FinishedOp)
	assert.Regexp(t, `^dist: all_reduce #2 timed out after \d+ms waiting for rank 2 \(rank 2 last finished all_reduce #1, \d+\.\d s ago\)$`, errs[0].Error())
	// The context's 300 ms run from before the collective started, so
	// After, timed from the start, can fall short of them by that gap.
	assert.GreaterOrEqual(t, te.After, 250*time.Millisecond)
	assert.Less(t, te.After, 10*time.Second)
	t.Log(errs[0])

	var pe *PeerError
	require.ErrorAs(t, errs[1], &pe)
	assert.Equal(t, 2, pe.Rank, "rank 1 blames the straggler, not rank 0: %v", errs[1])
	var a *AbortError
	require.ErrorAs(t, errs[1], &a)
	assert.Equal(t, KindTimeout, a.Kind)
	assert.Equal(t, 0, a.Reporter)
	assert.Contains(t, a.Msg, "waiting for rank 2 (rank 2 last finished all_reduce #1")
	t.Log(errs[1])

	// Every rank's view of the others.
	ps := c.gs[1].Progress()
	require.Len(t, ps, 2)
	assert.Equal(t, 0, ps[0].Rank)
	assert.Equal(t, 2, ps[1].Rank)
	assert.Equal(t, uint64(1), ps[1].FinishedSeq)
}

// TestStallReport: a collective with no timeout that waits longer than the
// stall threshold logs a report naming the rank it waits for, once per
// threshold.
func TestStallReport(t *testing.T) {
	var logs transporttest.LogBuffer
	l := slog.New(slog.NewTextHandler(&logs, nil))
	c := newCluster(t, 2, withProgressInterval(10*time.Millisecond), WithStallThreshold(100*time.Millisecond), WithLogger(l))
	requireNoErrors(t, c.run(func(r int, g *ProcessGroup) error { return g.Barrier(bg) }))
	time.Sleep(30 * time.Millisecond)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- c.gs[0].AllReduce(bg, F32(make([]float32, 4)), Sum) }()
	time.Sleep(350 * time.Millisecond) // about three thresholds
	require.NoError(t, c.gs[1].AllReduce(bg, F32(make([]float32, 4)), Sum))
	require.NoError(t, <-done)
	waited := time.Since(start)
	out := logs.String()
	n := strings.Count(out, "stalled")
	// One report per threshold waited, none before the first.
	assert.True(t, n >= 2 && n <= int(waited/(100*time.Millisecond)), "%d reports in %v:\n%s", n, waited, out)
	assert.Contains(t, out, "dist: all_reduce #2 stalled: waiting ")
	assert.Contains(t, out, "for rank 1 (rank 1 last finished barrier #1, ")
	t.Log(out)
}

func TestProgressDescribe(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		p    PeerProgress
		want string
	}{
		{PeerProgress{Rank: 3}, "nothing heard from rank 3 yet"},
		{PeerProgress{Rank: 3, Heard: true}, "rank 3 has not started a collective"},
		{PeerProgress{Rank: 2, Heard: true, StartedOp: "all_reduce", StartedSeq: 11, FinishedOp: "all_reduce", FinishedSeq: 11,
			FinishedAt: now.Add(-4900 * time.Millisecond)}, "rank 2 last finished all_reduce #11, 4.9 s ago"},
		{PeerProgress{Rank: 2, Heard: true, StartedOp: "broadcast", StartedSeq: 12, StartedAt: now.Add(-time.Second),
			FinishedOp: "all_reduce", FinishedSeq: 11, FinishedAt: now.Add(-2 * time.Second)},
			"rank 2 is in broadcast #12, started 1.0 s ago; last finished all_reduce #11, 2.0 s ago"},
	} {
		assert.Equal(t, tc.want, tc.p.Describe(now))
	}
}

func TestNoticeRoundTrip(t *testing.T) {
	for _, a := range []*AbortError{
		{Kind: KindLost, Rank: 2, Reporter: 0, Op: "all_reduce", Seq: 12, Msg: "transport: peer lost: EOF"},
		{Kind: KindTimeout, Rank: 1, Reporter: 2, Op: "broadcast", Seq: 1 << 40, Msg: strings.Repeat("é", 400)},
		{Kind: KindUser, Rank: 0, Reporter: 0, Op: "pipeline", Msg: ""},
	} {
		got, err := decodeNotice(3, 4, a.Reporter, encodeNotice(a))
		require.NoError(t, err)
		assert.Equal(t, a.Kind, got.Kind)
		assert.Equal(t, a.Rank, got.Rank)
		assert.Equal(t, a.Reporter, got.Reporter)
		assert.Equal(t, a.Op, got.Op)
		assert.Equal(t, a.Seq, got.Seq)
		assert.Equal(t, truncate(a.Msg, maxReason), got.Msg)
		assert.ErrorIs(t, got, ErrAborted)
		assert.ErrorIs(t, got, a.Kind.Sentinel())
	}
	de := &DesyncError{Rank: 1, Peer: 3, Seq: 7, PeerSeq: 8, Local: describe(fingerprint(kAllReduce, Float32, Sum, 0, 10)),
		Remote: describe(fingerprint(kBroadcast, Float64, Sum, 2, 4)), LocalSite: "a.go:1", RemoteSite: "b.go:2"}
	a := &AbortError{Kind: KindDesync, Rank: 3, Reporter: 1, Op: "all_reduce", Seq: 7, Err: de, Msg: de.Error()}
	got, err := decodeNotice(3, 4, 1, encodeNotice(a))
	require.NoError(t, err)
	var gde *DesyncError
	require.ErrorAs(t, got, &gde)
	// Seen from rank 3, the other side.
	assert.Equal(t, &DesyncError{Rank: 3, Peer: 1, Seq: 8, PeerSeq: 7, Local: de.Remote, Remote: de.Local,
		LocalSite: "b.go:2", RemoteSite: "a.go:1"}, gde)
	assert.ErrorIs(t, got, ErrDesync)
	// Rank 3 relays it as it decoded it; rank 2 sees it as rank 1 reported
	// it (it used to read "rank 1 called ... but rank 1 called ...").
	relayed, err := decodeNotice(2, 4, 3, encodeNotice(got))
	require.NoError(t, err)
	require.ErrorAs(t, relayed, &gde)
	assert.Equal(t, de, gde)
	assert.Equal(t, 1, relayed.Reporter)
	assert.Equal(t, 3, relayed.Rank)

	// Malformed notices are protocol errors naming the sender.
	good := encodeNotice(&AbortError{Kind: KindLost, Rank: 1, Reporter: 0, Op: "x"})
	for _, b := range [][]byte{nil, {9}, good[:5], append(append([]byte{}, good...), 0), func() []byte {
		b := append([]byte{}, good...)
		b[1] = 99
		return b
	}(), func() []byte {
		b := append([]byte{}, good...)
		b[2] = 200 // rank out of range
		return b
	}()} {
		_, err := decodeNotice(0, 4, 2, b)
		var pe *PeerError
		require.ErrorAs(t, err, &pe, "%x", b)
		assert.Equal(t, 2, pe.Rank)
		assert.ErrorIs(t, err, ErrProtocol)
	}
}

func FuzzDecodeNotice(f *testing.F) {
	f.Add(encodeNotice(&AbortError{Kind: KindLost, Rank: 1, Reporter: 0, Op: "all_reduce", Seq: 3, Msg: "m"}))
	f.Add(encodeNotice(&AbortError{Kind: KindDesync, Rank: 1, Reporter: 0, Op: "all_reduce", Err: &DesyncError{Peer: 1}}))
	f.Add(encodeNotice(&AbortError{Kind: KindDesync, Rank: 0, Reporter: 2, Op: "all_reduce", Err: &DesyncError{Rank: 2, Peer: 0, Seq: 4, PeerSeq: 5}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := decodeNotice(0, 4, 1, b)
		if err != nil {
			var pe *PeerError
			if !errors.As(err, &pe) || !errors.Is(err, ErrProtocol) {
				t.Fatalf("error %v is not a protocol error", err)
			}
			return
		}
		// What decodes re-encodes to the same bytes (a desync seen from
		// its other side is turned back to the reporter's view).
		if !bytes.Equal(encodeNotice(a), b) {
			t.Fatalf("re-encoding differs")
		}
	})
}
