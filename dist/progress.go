package dist

// Progress: every rank knows where its peers are. Each rank sends each
// peer, on the job's progress tag, the last collective it started and the
// last it finished in every group the two share (sequence number,
// operation and how long ago), at most once per progress interval and only
// when that changed. A collective that times out names the members it was
// waiting for and where they were; a collective that waits longer than
// the stall threshold logs the same report (once per threshold), like
// Horovod's stall inspector.
//
// Message layout (progressLen bytes, little-endian): version u8, started
// op u8 (opKind), finished op u8, reserved u8, started seq u64, finished
// seq u64, milliseconds since it started u32, since it finished u32, group
// id u32.

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gdist/gdist/dist/transport"
)

const (
	progressVersion = 2
	progressLen     = 32

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

// progress is this rank's and the other members' progress in one group,
// under the domain's lock; peers is indexed by member.
type progress struct {
	self struct {
		started, finished mark
	}
	peers []peerMarks
}

type peerMarks struct {
	heard             bool
	started, finished mark // at: estimated on this rank's clock
}

// PeerProgress is where a rank was in a group, as far as this rank knew
// (Rank is its rank in the job): the last collective of the group it had
// started and the last it had finished (operation name,
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
func (d *domain) queued() []transport.Queued {
	b, ok := d.t.(transport.Backlog)
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

// Progress returns where every other member of the group was, as far as
// this rank knew, in member order. The caller owns the slice.
func (g *ProcessGroup) Progress() []PeerProgress {
	g.d.mu.Lock()
	defer g.d.mu.Unlock()
	out := make([]PeerProgress, 0, g.size-1)
	for m, pm := range g.prog.peers {
		if m != g.rank {
			out = append(out, pm.public(g.global(m)))
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

// waitingFor returns the members that collective seq of g waits for: those
// that had not started it if there are any, else those that had not
// finished it.
func (g *ProcessGroup) waitingFor(seq uint64) []PeerProgress {
	g.d.mu.Lock()
	defer g.d.mu.Unlock()
	var absent, unfinished []PeerProgress
	for m, pm := range g.prog.peers {
		if m == g.rank || pm.finished.seq >= seq {
			continue
		}
		p := pm.public(g.global(m))
		unfinished = append(unfinished, p)
		if !pm.heard || pm.started.seq < seq {
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
func (d *domain) startProgress() {
	if d.world == 1 {
		return
	}
	for p := range d.world {
		if p == d.rank {
			continue
		}
		d.wg.Add(2)
		go d.sendProgress(p)
		go d.recvProgress(p)
	}
	if d.cfg.stall > 0 {
		d.wg.Add(1)
		go d.inspectStalls()
	}
}

// groupMarks is where this rank is in one group, as sendProgress sends it.
type groupMarks struct {
	id                uint32
	started, finished mark
}

// sendProgress tells peer p where this rank is in every group they share
// whenever that changed, at most once per progress interval, until the job
// closes or p is gone. One goroutine per peer, so that a peer that reads
// nothing (its link's flow-control window full) delays only its own
// updates. It allocates only when the groups change.
func (d *domain) sendProgress(p int) {
	defer d.wg.Done()
	var (
		buf  [progressLen]byte
		sent = make(map[uint32][2]uint64)
		cur  []groupMarks
		tick = time.NewTicker(d.cfg.progressEvery)
		hdr  transport.Header
		le   = binary.LittleEndian
	)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-d.done:
			return
		}
		cur = cur[:0]
		d.mu.Lock()
		for id, g := range d.groups {
			if g.member(p) < 0 {
				continue
			}
			s, f := g.prog.self.started, g.prog.self.finished
			if last, ok := sent[id]; ok && last == [2]uint64{s.seq, f.seq} {
				continue
			}
			cur = append(cur, groupMarks{id, s, f})
		}
		if len(sent) > len(d.groups) { // forget the groups closed since
			for id := range sent {
				if d.groups[id] == nil {
					delete(sent, id)
				}
			}
		}
		d.mu.Unlock()
		now := time.Now()
		for _, m := range cur {
			s, f := m.started, m.finished
			buf[0], buf[1], buf[2], buf[3] = progressVersion, byte(s.kind), byte(f.kind), 0
			le.PutUint64(buf[4:], s.seq)
			le.PutUint64(buf[12:], f.seq)
			le.PutUint32(buf[20:], agoMillis(now, s.at))
			le.PutUint32(buf[24:], agoMillis(now, f.at))
			le.PutUint32(buf[28:], m.id)
			if err := d.t.Send(d.gctx, p, TagReservedBase+tagProgress, hdr, buf[:]); err != nil {
				return // closed, or p is gone: the failure is handled elsewhere
			}
			sent[m.id] = [2]uint64{s.seq, f.seq}
		}
	}
}

func agoMillis(now, t time.Time) uint32 {
	if t.IsZero() {
		return 0
	}
	return uint32(min(max(now.Sub(t).Milliseconds(), 0), 1<<32-1))
}

// recvProgress records peer p's progress messages until the job closes or
// p is gone.
func (d *domain) recvProgress(p int) {
	defer d.wg.Done()
	var buf [progressLen]byte
	le := binary.LittleEndian
	for {
		_, n, err := d.t.RecvInto(d.gctx, p, TagReservedBase+tagProgress, buf[:])
		if err != nil {
			return
		}
		if n != progressLen || buf[0] != progressVersion {
			continue // from another version: ignore rather than fail the job
		}
		now := time.Now()
		m := peerMarks{heard: true,
			started:  mark{seq: le.Uint64(buf[4:]), kind: opKind(buf[1])},
			finished: mark{seq: le.Uint64(buf[12:]), kind: opKind(buf[2])}}
		m.started.at = now.Add(-time.Duration(le.Uint32(buf[20:])) * time.Millisecond)
		m.finished.at = now.Add(-time.Duration(le.Uint32(buf[24:])) * time.Millisecond)
		d.mu.Lock()
		if g := d.groups[le.Uint32(buf[28:])]; g != nil {
			if i := g.member(p); i >= 0 {
				g.prog.peers[i] = m
			}
		}
		d.mu.Unlock()
	}
}

// inspectStalls logs a stall report for a collective that has been
// running for the stall threshold, and again after each further
// threshold, until it ends.
func (d *domain) inspectStalls() {
	defer d.wg.Done()
	tick := time.NewTicker(max(min(d.cfg.progressEvery, d.cfg.stall/10), time.Millisecond))
	defer tick.Stop()
	var stalled []*ProcessGroup
	for {
		select {
		case <-tick.C:
		case <-d.done:
			return
		}
		stalled = stalled[:0]
		d.mu.Lock()
		for _, g := range d.groups {
			if !g.running {
				continue
			}
			waited := time.Since(g.prog.self.started.at)
			if int64(waited/d.cfg.stall) <= g.stallCount {
				continue
			}
			g.stallCount = int64(waited / d.cfg.stall)
			stalled = append(stalled, g)
		}
		d.mu.Unlock()
		for _, g := range stalled {
			d.mu.Lock()
			cur, started := g.cur, g.prog.self.started.at
			d.mu.Unlock()
			waited := time.Since(started)
			name := g.opName(cur.kind)
			msg := fmt.Sprintf("dist: %s #%d stalled: waiting %v for %s%s", name, cur.seq,
				waited.Round(100*time.Millisecond), describeWaiting(g.waitingFor(cur.seq), time.Now()), describeQueued(d.queued()))
			d.cfg.stallLog.Warn(msg, "op", name, "seq", cur.seq, "waited", waited)
		}
	}
}
