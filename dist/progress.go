package dist

// Progress: every rank knows where every peer is. Each rank sends its
// peers, on tagProgress, the last collective it started and the last it
// finished (sequence number, operation and how long ago), at most once per
// progress interval and only when that changed. A collective that times
// out names the ranks it was waiting for and where they were; a
// collective that waits longer than the stall threshold logs the same
// report (once per threshold), like Horovod's stall inspector.
//
// Message layout (progressLen bytes, little-endian): version u8, started
// op u8 (opKind), finished op u8, reserved u8, started seq u64, finished
// seq u64, milliseconds since it started u32, since it finished u32.

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist/dist/transport"
)

const (
	progressVersion = 1
	progressLen     = 28

	// defaultProgressInterval is how often a rank tells its peers where it
	// is, if that changed.
	defaultProgressInterval = 500 * time.Millisecond
	// DefaultStallThreshold is how long a collective may wait before the
	// group logs a stall report (WithStallThreshold, GDIST_STALL_THRESHOLD).
	DefaultStallThreshold = 60 * time.Second
)

// mark is one end of a collective: which one and when.
type mark struct {
	seq  uint64
	kind opKind
	at   time.Time
}

// progress is this rank's and its peers' progress. self is written by the
// running collective under the group's lock; peers under mu.
type progress struct {
	self struct {
		started, finished mark
	}

	mu    sync.Mutex
	peers []peerMarks
}

type peerMarks struct {
	heard             bool
	started, finished mark // at: estimated on this rank's clock
}

// PeerProgress is where a rank was, as far as this rank knew: the last
// collective it had started and the last it had finished (operation name,
// sequence number and when, on this rank's clock, estimated from what the
// rank reported and when it arrived). Heard is false if nothing had been
// heard from it yet; an empty op means none.
type PeerProgress struct {
	Rank        int
	Heard       bool
	StartedOp   string
	StartedSeq  uint64
	StartedAt   time.Time
	FinishedOp  string
	FinishedSeq uint64
	FinishedAt  time.Time
}

// Describe says where the rank was at now, like "rank 2 last finished
// all_reduce #11, 4.9 s ago".
func (p PeerProgress) Describe(now time.Time) string {
	ago := func(t time.Time) string { return fmt.Sprintf("%.1f s ago", now.Sub(t).Seconds()) }
	switch {
	case !p.Heard:
		return fmt.Sprintf("nothing heard from rank %d yet", p.Rank)
	case p.StartedSeq > p.FinishedSeq:
		s := fmt.Sprintf("rank %d is in %s #%d, started %s", p.Rank, p.StartedOp, p.StartedSeq, ago(p.StartedAt))
		if p.FinishedSeq != 0 {
			s += fmt.Sprintf("; last finished %s #%d, %s", p.FinishedOp, p.FinishedSeq, ago(p.FinishedAt))
		}
		return s
	case p.FinishedSeq != 0:
		return fmt.Sprintf("rank %d last finished %s #%d, %s", p.Rank, p.FinishedOp, p.FinishedSeq, ago(p.FinishedAt))
	}
	return fmt.Sprintf("rank %d has not started a collective", p.Rank)
}

// describeWaiting formats the ranks a collective waits for, like
// "rank 2 (rank 2 last finished all_reduce #11, 4.9 s ago)".
func describeWaiting(ps []PeerProgress, now time.Time) string {
	if len(ps) == 0 {
		return "no rank this rank knows of"
	}
	var ranks, where []string
	for _, p := range ps {
		ranks = append(ranks, fmt.Sprint(p.Rank))
		where = append(where, p.Describe(now))
	}
	word := "rank "
	if len(ps) > 1 {
		word = "ranks "
	}
	return word + strings.Join(ranks, ", ") + " (" + strings.Join(where, "; ") + ")"
}

// queued returns the point-to-point messages the transport holds
// unreceived, if it can tell (transport.Backlog). The group's own messages
// are left out: collective messages queued while a collective waits are
// its ordinary traffic.
func (g *ProcessGroup) queued() []transport.Queued {
	b, ok := g.t.(transport.Backlog)
	if !ok {
		return nil
	}
	return slices.DeleteFunc(b.Queued(), func(q transport.Queued) bool { return q.Tag >= TagReservedBase })
}

// describeQueued formats unreceived point-to-point messages for a timeout
// or stall report, like "; unreceived: from rank 1 to rank 0, tag 5: 1 message,
// 68000000 bytes (a message nobody receives holds back what its sender
// sends next)", or "" if there are none.
func describeQueued(qs []transport.Queued) string {
	if len(qs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("; unreceived: ")
	for i, q := range qs {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "from rank %d to rank %d, tag %d: %d message", q.From, q.To, q.Tag, q.Messages)
		if q.Messages != 1 {
			b.WriteString("s")
		}
		fmt.Fprintf(&b, ", %d bytes", q.Bytes)
	}
	b.WriteString(" (a message nobody receives holds back what its sender sends next)")
	return b.String()
}

// Progress returns where every other rank was, as far as this rank knew,
// in rank order. The caller owns the slice.
func (g *ProcessGroup) Progress() []PeerProgress {
	g.prog.mu.Lock()
	defer g.prog.mu.Unlock()
	out := make([]PeerProgress, 0, g.world-1)
	for r, m := range g.prog.peers {
		if r != g.rank {
			out = append(out, m.public(r))
		}
	}
	return out
}

func (m peerMarks) public(r int) PeerProgress {
	p := PeerProgress{Rank: r, Heard: m.heard, StartedSeq: m.started.seq, StartedAt: m.started.at,
		FinishedSeq: m.finished.seq, FinishedAt: m.finished.at}
	if m.started.seq != 0 {
		p.StartedOp = m.started.kind.String()
	}
	if m.finished.seq != 0 {
		p.FinishedOp = m.finished.kind.String()
	}
	return p
}

// waitingFor returns the peers that collective seq waits for: those that
// had not started it if there are any, else those that had not finished it.
func (g *ProcessGroup) waitingFor(seq uint64) []PeerProgress {
	g.prog.mu.Lock()
	defer g.prog.mu.Unlock()
	var absent, unfinished []PeerProgress
	for r, m := range g.prog.peers {
		if r == g.rank || m.finished.seq >= seq {
			continue
		}
		p := m.public(r)
		unfinished = append(unfinished, p)
		if !m.heard || m.started.seq < seq {
			absent = append(absent, p)
		}
	}
	if len(absent) > 0 {
		return absent
	}
	return unfinished
}

// startProgress starts the progress goroutines: per peer a sender and a
// receiver, and the stall inspector.
func (g *ProcessGroup) startProgress() {
	g.prog.peers = make([]peerMarks, g.world)
	if g.world == 1 {
		return
	}
	for p := range g.world {
		if p == g.rank {
			continue
		}
		g.wg.Add(2)
		go g.sendProgress(p)
		go g.recvProgress(p)
	}
	if g.cfg.stall > 0 {
		g.wg.Add(1)
		go g.inspectStalls()
	}
}

// sendProgress tells peer p where this rank is whenever that changed, at
// most once per progress interval, until the group closes or p is gone.
// One goroutine per peer, so that a peer that reads nothing (its link's
// flow-control window full) delays only its own updates. It allocates
// nothing after it started.
func (g *ProcessGroup) sendProgress(p int) {
	defer g.wg.Done()
	var (
		buf      [progressLen]byte
		sent     [2]uint64
		tick     = time.NewTicker(g.cfg.progressEvery)
		hdr      transport.Header
		le       = binary.LittleEndian
		everSent bool
	)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-g.done:
			return
		}
		g.mu.Lock()
		s, f := g.prog.self.started, g.prog.self.finished
		g.mu.Unlock()
		if everSent && sent == [2]uint64{s.seq, f.seq} {
			continue
		}
		now := time.Now()
		buf[0], buf[1], buf[2], buf[3] = progressVersion, byte(s.kind), byte(f.kind), 0
		le.PutUint64(buf[4:], s.seq)
		le.PutUint64(buf[12:], f.seq)
		le.PutUint32(buf[20:], agoMillis(now, s.at))
		le.PutUint32(buf[24:], agoMillis(now, f.at))
		if err := g.t.Send(g.gctx, p, tagProgress, hdr, buf[:]); err != nil {
			return // closed, or p is gone: the failure is handled elsewhere
		}
		sent, everSent = [2]uint64{s.seq, f.seq}, true
	}
}

func agoMillis(now, t time.Time) uint32 {
	if t.IsZero() {
		return 0
	}
	return uint32(min(max(now.Sub(t).Milliseconds(), 0), 1<<32-1))
}

// recvProgress records peer p's progress messages until the group closes
// or p is gone.
func (g *ProcessGroup) recvProgress(p int) {
	defer g.wg.Done()
	var buf [progressLen]byte
	le := binary.LittleEndian
	for {
		_, n, err := g.t.RecvInto(g.gctx, p, tagProgress, buf[:])
		if err != nil {
			return
		}
		if n != progressLen || buf[0] != progressVersion {
			continue // from a newer version: ignore rather than fail the job
		}
		now := time.Now()
		m := peerMarks{heard: true,
			started:  mark{seq: le.Uint64(buf[4:]), kind: opKind(buf[1])},
			finished: mark{seq: le.Uint64(buf[12:]), kind: opKind(buf[2])}}
		m.started.at = now.Add(-time.Duration(le.Uint32(buf[20:])) * time.Millisecond)
		m.finished.at = now.Add(-time.Duration(le.Uint32(buf[24:])) * time.Millisecond)
		g.prog.mu.Lock()
		g.prog.peers[p] = m
		g.prog.mu.Unlock()
	}
}

// inspectStalls logs a stall report for a collective that has been
// running for the stall threshold, and again after each further
// threshold, until it ends.
func (g *ProcessGroup) inspectStalls() {
	defer g.wg.Done()
	tick := time.NewTicker(max(min(g.cfg.progressEvery, g.cfg.stall/10), time.Millisecond))
	defer tick.Stop()
	var (
		seq     uint64
		reports int64
	)
	for {
		select {
		case <-tick.C:
		case <-g.done:
			return
		}
		g.mu.Lock()
		running, cur, started := g.running, g.cur, g.prog.self.started.at
		g.mu.Unlock()
		if !running {
			continue
		}
		if cur.seq != seq {
			seq, reports = cur.seq, 0
		}
		waited := time.Since(started)
		if int64(waited/g.cfg.stall) <= reports {
			continue
		}
		reports = int64(waited / g.cfg.stall)
		msg := fmt.Sprintf("dist: %s #%d stalled: waiting %v for %s%s", cur.kind, cur.seq,
			waited.Round(100*time.Millisecond), describeWaiting(g.waitingFor(cur.seq), time.Now()), describeQueued(g.queued()))
		g.cfg.stallLog.Warn(msg, "op", cur.kind.String(), "seq", cur.seq, "waited", waited)
	}
}
