//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/internal/bufpool"
	"github.com/gdist/gdist/dist/transport/internal/mailbox"
	"github.com/gdist/gdist/dist/transport/shm/internal/ring"
)

const (
	// parkMax bounds one futex wait; everything that matters rings the bell,
	// so it is only a safety net.
	parkMax = 250 * time.Millisecond
	// yieldMin: after queueing a payload this large the reader yields, so a
	// waiting receiver can take it (and recycle its buffer) first.
	yieldMin = 16 << 10
	// wakeCap bounds how many credit waiters one change wakes directly.
	wakeCap = 1024
	// warmMin: the first record this large through a ring makes each side
	// map the ring's pages in one go (see warmTo).
	warmMin = 16 << 10
	// warmChunk: until then, each side maps the ring's pages this many
	// bytes at a time, ahead of where it writes or reads (see warmTo).
	warmChunk = 256 << 10
	// recycleMin, recycleEvery: a sender of records below restartMin looks
	// whether it can restart the ring once it is recycleMin bytes into a
	// lap, and then every recycleEvery bytes (see recycle).
	recycleMin   = 256 << 10
	recycleEvery = 64 << 10
	// firstPiece: a sender publishes the first firstPieces bytes of a
	// record every firstPiece bytes (then every chunk).
	firstPiece  = 32 << 10
	firstPieces = 256 << 10
	// recheckEvery: a sender reads the peer's tail and credit when the
	// values it last saw leave too little room, and at least every
	// recheckEvery sends (so that a peer scribbling on them is caught).
	recheckEvery = 64
)

// peer is one established link: the pair's region, this rank's producer
// side of the outbound ring and consumer side of the inbound one.
type peer struct {
	t      *Transport
	rank   int
	conn   *net.UnixConn
	region []byte

	outR, inR *ring.Ring
	out       *ring.Producer // guarded by wmu
	in        *ring.Consumer // reader goroutine only
	myBell    ring.Bell      // this rank parks on it (inbound ring's consumer bell)
	peerBell  ring.Bell      // the peer parks on it (outbound ring's consumer bell)
	chunk     uint64         // bytes a sender writes before publishing

	window   int64  // the peer's queue limit: our send window (0 = unbounded)
	maxFrame uint64 // the largest payload the peer accepts
	pid      int    // the peer's process id, from the kernel (SO_PEERCRED)

	// write side
	wmu          sync.Mutex
	wdead        bool          // the region is about to be unmapped (guarded by wmu)
	outWarm      uint64        // the outbound ring's pages are mapped up to this offset (guarded by wmu)
	recycleAt    uint64        // the position from which recycle looks again (guarded by wmu)
	recycleAsked bool          // recycle set the ring's space-wait flag (guarded by wmu)
	spaceCh      chan struct{} // capacity 1: the outbound tail moved
	spaceWaiting atomic.Bool

	// single copy: remote records (see WithSingleCopy)
	remoteSent uint64                // remote records written (guarded by wmu)
	restarts   uint64                // lap marks written (guarded by wmu)
	ackSeen    uint64                // the peer's ack count as last checked (guarded by wmu)
	pin        runtime.Pinner        // keeps a remote record's buffer in place (guarded by wmu)
	desc       [ring.RemoteSize]byte // guarded by wmu
	ackCh      chan struct{}         // capacity 1: the outbound ack count moved
	ackWaiting atomic.Bool
	// reader-only
	lastAck      uint64
	remoteProbed bool // the peer's probe word was tried
	remoteOK     bool // we can read the peer's memory, and told it so
	liov         [1]unix.Iovec
	riov         [1]unix.RemoteIovec
	scratch      []byte // combineRemote's buffer
	elem         []byte // combineFrom's buffer for an element split by the ring's end
	inWarm       uint64 // the inbound ring's pages are mapped up to this offset

	// send credit, guarded by wmu: a send takes its credit under the lock
	// it writes its record under (one lock per message, not two), and lets
	// go of it while it waits for credit
	sends         uint64 // acquires
	sent          uint64 // payload bytes acquired
	freedSeen     uint64 // the peer's freed counter as last checked
	creditWaiters atomic.Int32
	credit        chan struct{}

	// receive credit: application goroutines return credit under fmu
	fmu   sync.Mutex
	fdead bool

	// The consumer side of the inbound ring (in, the reader-only fields
	// above and below) belongs to whoever holds rmu: the reader goroutine,
	// or an application goroutine that waits for a message and delivers
	// what has arrived itself (progress, through the mailbox's Poller).
	rmu        sync.Mutex
	rdead      bool          // the region is about to be unmapped (guarded by rmu)
	deliveries uint64        // records delivered to the mailbox (guarded by rmu)
	owed       int           // credit of records taken but not yet settled (guarded by rmu)
	owedMax    uint64        // the largest record a receive may leave owed (see owedMax)
	owings     uint64        // records left owed (guarded by rmu)
	polls      uint64        // polls of the ring by receivers (guarded by rmu)
	lazyArmed  atomic.Bool   // lazyKick is set to run
	lazyKick   *time.Timer   // wakes the reader once receives stop taking records
	lazySeen   atomic.Uint32 // pollers.begun() at lazyWake's last look
	pollers    pollCount     // application goroutines polling the ring
	pspin      pollSpin      // how they spin
	needed     atomic.Bool   // a poller met a record it leaves to the reader
	kick       chan struct{} // capacity 1: wakes the reader when polling stops or a record needs it

	// what the outbound ring looked like at the last poll (guarded by omu)
	omu                 sync.Mutex
	lastTail, lastFreed uint64
	rspin               spinner      // the reader goroutine's, while idle
	patience            atomic.Int64 // nanoseconds the idle reader polls before it parks (set by the reader only)
	sspin               spinner      // of whoever waits for the rest of a record (guarded by rmu)
	wspin               spinner      // guarded by wmu
	writes              uint64       // waitSpace calls (guarded by wmu)

	// liveness (monitor only)
	lastBeat   uint64
	lastBeatAt time.Time

	gone     atomic.Bool // the peer said goodbye
	goneCh   chan struct{}
	goneOnce sync.Once

	lost     atomic.Bool
	lostErr  error // set before lost
	lostCh   chan struct{}
	lostOnce sync.Once
}

func newPeer(t *Transport, l link) (*peer, error) {
	// The lower rank (the server) writes direction 0.
	outDir, inDir := 1, 0
	if l.server {
		outDir, inDir = 0, 1
	}
	outR, err := ring.View(l.region, l.ringSize, outDir)
	if err != nil {
		return nil, err
	}
	inR, err := ring.View(l.region, l.ringSize, inDir)
	if err != nil {
		return nil, err
	}
	p := &peer{
		t:          t,
		rank:       l.rank,
		conn:       l.conn,
		region:     l.region,
		outR:       outR,
		inR:        inR,
		out:        ring.NewProducer(outR),
		in:         ring.NewConsumer(inR),
		myBell:     inR.Bell(),
		peerBell:   outR.Bell(),
		chunk:      max(uint64(l.ringSize)/8, 4<<10),
		window:     int64(min(l.info.QueueLimit, 1<<62)),
		maxFrame:   min(l.info.MaxFrame, ring.MaxLen),
		pid:        int(l.pid),
		spaceCh:    make(chan struct{}, 1),
		ackCh:      make(chan struct{}, 1),
		credit:     make(chan struct{}, wakeCap),
		kick:       make(chan struct{}, 1),
		goneCh:     make(chan struct{}),
		lostCh:     make(chan struct{}),
		lastBeatAt: time.Now(),
		rspin:      spinner{budget: maxPoll},
		sspin:      spinner{budget: maxPoll},
		wspin:      spinner{budget: maxPoll},
	}
	p.pspin.init()
	p.owedMax = min(owedMax, uint64(l.ringSize)/16)
	if t.cfg.queueLimit > 0 {
		p.owedMax = min(p.owedMax, uint64(t.cfg.queueLimit)/16)
	}
	p.patience.Store(int64(t.cfg.spin))
	p.lazyKick = time.AfterFunc(time.Hour, p.lazyWake)
	p.lazyKick.Stop()
	if t.cfg.remoteMin > 0 && p.pid > 0 {
		p.outR.SetProbe(uint64(uintptr(unsafe.Pointer(t.probe))), *t.probe)
	}
	return p, nil
}

func signal(c chan struct{}) { wake(c, 1) }

func wake(c chan struct{}, n int) {
	for range min(n, cap(c)) {
		select {
		case c <- struct{}{}:
		default:
			return
		}
	}
}

// goneErr returns the error of an operation op involving a peer that was
// lost or said goodbye (or ErrClosed after Close), nil for a live one.
func (p *peer) goneErr(op string) error {
	if !p.t.closing.Load() && !p.lost.Load() && !p.gone.Load() {
		return nil
	}
	return p.goneErrSlow(op)
}

func (p *peer) goneErrSlow(op string) error {
	switch {
	case p.t.closing.Load():
		return errClosed(op)
	case p.lost.Load():
		return &transport.PeerError{Rank: p.rank, Op: op, Err: p.lostErr}
	case p.gone.Load():
		return &transport.PeerError{Rank: p.rank, Op: op, Err: transport.ErrPeerClosed}
	}
	return nil
}

// spinning reports whether a waiter that started at start (and has
// polled i times) should keep polling rather than park.
func (p *peer) spinning(i int, start time.Time) bool {
	return i < 4 || (p.t.cfg.spin > 0 && time.Since(start) < p.t.cfg.spin)
}

// spinner adapts how long a waiter polls before it also yields the CPU
// to the kernel. When the peer runs on another CPU its reply comes while
// we poll, and yielding would only cost latency (or hand the CPU to an
// unrelated process, for a whole time slice on a loaded machine). When
// the two processes share a CPU the reply comes only after we yield, and
// polling longer merely delays it. The sign of that is a reply found
// right after the first yield: then the budget halves, down to zero. A
// reply that takes several yields says nothing (the peer was busy, or
// descheduled by other load) and leaves the budget alone; one that comes
// while polling doubles it, up to maxPoll. Every probeEvery waits it is
// reset to the maximum, to notice that the processes moved apart again.
type spinner struct {
	budget time.Duration // poll this long before yielding
	yields int           // sched_yield calls in the current wait
	waits  uint32
}

const (
	maxPoll    = 20 * time.Microsecond
	probeEvery = 64
)

// pause is one step of a spin that started at start. It reports whether
// another goroutine of this process ran meanwhile (its Gosched took at
// least busyYield).
func (s *spinner) pause(start time.Time) (busy bool) {
	t := time.Now()
	pausing.Add(1)
	runtime.Gosched() // let this process's other goroutines run
	spinners := pausing.Add(-1) > 0
	now := time.Now()
	if now.Sub(start) >= s.budget {
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		s.yields++
	}
	return !spinners && now.Sub(t) >= busyYield
}

// pausing counts the goroutines of this process inside a spinner's
// Gosched. A pause that finds others there cannot tell their polls from
// work and does not report busy: spinners that took each other for work
// would never park.
var pausing atomic.Int32

// busyYield is the length from which a pause's Gosched counts as having
// run another goroutine: with none runnable a Gosched takes about 0.2 µs.
//
// A goroutine parked on a futex holds its P in the system call until the
// runtime's monitor takes it back, which it does within its own period:
// 20 µs after activity, but up to 10 ms once the process has run a while
// without blocking. With GOMAXPROCS=1 a goroutine that parks while another
// is runnable stalls that one for as long. So the waits that park on a
// futex (a receive waiting for the rest of a record, the reader waiting for
// the next) restart their spin whenever another goroutine ran during it,
// and park only once the rest of the process is blocked too. In a
// 2-stage GPipe pipeline at m = 16 and 32 this took the bubble from about
// a third of the step to 0.1-0.15.
const busyYield = 2 * time.Microsecond

// done records how a wait that spun ended: served while spinning or not.
func (s *spinner) done(served bool) {
	s.waits++
	switch {
	case s.waits%probeEvery == 0:
		s.budget = maxPoll
	case served && s.yields == 1:
		s.budget /= 2
		if s.budget < time.Microsecond {
			s.budget = 0
		}
	case served && s.yields == 0:
		s.budget = min(2*s.budget+time.Microsecond, maxPoll)
	}
	s.yields = 0
}

// pollSpin is the spinner of the receivers that poll a peer's ring
// (mailbox.Poller), shared by them and updated atomically: they poll for
// the budget, then also yield the CPU to the kernel between polls, and the
// budget adapts as spinner's does — halved when a record comes right after
// the first yield (the peer needed this CPU, or was descheduled by other
// load), doubled when one comes while polling (the peer runs on another
// CPU, and yielding would only cost latency), and reset to the maximum
// every probeEvery records that found it below.
type pollSpin struct {
	budget atomic.Int64 // nanoseconds
	// since is when the current wait started, nanoseconds since epoch, or
	// 0 until a poll first needs it (start): most waits end within a few
	// polls, and a clock read costs a few tens of nanoseconds on a
	// virtual machine, as much as the rest of a poll.
	since  atomic.Int64
	yields atomic.Int32
	waits  atomic.Uint32 // waits that ended below the maximum budget or after a yield
}

// epoch is the origin of pollSpin's monotonic nanoseconds.
var epoch = time.Now()

func nanotime() int64 { return int64(time.Since(epoch)) }

// start returns when the current wait started: now (nanotime), if no
// poll has asked before in this wait.
func (s *pollSpin) start(now int64) int64 {
	if t := s.since.Load(); t != 0 {
		return t
	}
	t := max(now, 1)
	if !s.since.CompareAndSwap(0, t) {
		return s.since.Load()
	}
	return t
}

// init sets the budget to the maximum.
func (s *pollSpin) init() { s.budget.Store(int64(maxPoll)) }

// begin starts a wait; its clock starts at the first poll that asks
// (start).
func (s *pollSpin) begin() {
	// Stores only where a value changes: an atomic store is a locked
	// instruction on amd64, and most waits leave both at zero.
	if s.since.Load() != 0 {
		s.since.Store(0)
	}
	if s.yields.Load() != 0 {
		s.yields.Store(0)
	}
}

// idle is a poll that found nothing: past the budget it yields the CPU.
func (s *pollSpin) idle() {
	if now := nanotime(); now-s.start(now) >= s.budget.Load() {
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		s.yields.Add(1)
	}
}

// served records a delivery and starts the next wait.
func (s *pollSpin) served() {
	s.adapt()
	s.begin()
}

// took records a delivery that ends the wait: the next starts with begin.
func (s *pollSpin) took() { s.adapt() }

// adapt updates the budget by how the wait ended.
func (s *pollSpin) adapt() {
	b := s.budget.Load()
	y := s.yields.Load()
	if y == 0 && b == int64(maxPoll) {
		return // served while polling, at the maximum: nothing changes (nor needs counting)
	}
	switch {
	case s.waits.Add(1)%probeEvery == 0:
		b = int64(maxPoll)
	case y == 1:
		if b /= 2; b < int64(time.Microsecond) {
			b = 0
		}
	case y == 0:
		b = min(2*b+int64(time.Microsecond), int64(maxPoll))
	}
	s.budget.Store(b)
}

// ---- send side ----

// send writes one message into the outbound ring: it waits, under ctx,
// for credit (the peer's queue limit), then streams the record through the
// ring in chunks as space frees up. Once writing has started it is not
// interrupted by ctx (that would leave half a record); it ends early only
// if the peer is lost or leaves, or this transport closes. stream writes
// the payload with non-temporal stores (ring.Producer.WriteStream).
func (p *peer) send(ctx context.Context, tag uint32, h transport.Header, b []byte, stream bool) error {
	if uint64(len(b)) > p.maxFrame {
		return fmt.Errorf("shm: send to rank %d: %w: %d bytes, the peer accepts %d",
			p.rank, transport.ErrFrameTooLarge, len(b), p.maxFrame)
	}
	if err := p.goneErr("send"); err != nil {
		return err
	}
	p.wmu.Lock()
	defer p.wmu.Unlock()
	if err := p.acquire(ctx, len(b)); err != nil {
		return err
	}
	if m := p.t.cfg.remoteMin; m > 0 && len(b) >= m && p.outR.RemoteOK() {
		return p.sendRemote(tag, h, b)
	}
	rh := ring.Header{Tag: tag, Len: uint64(len(b)), Meta: h}
	pad := ring.Pad(uint64(len(b)))
	rec := uint64(ring.HeaderSize+len(b)) + pad // the whole record
	size := p.outR.Size()
	if len(b) >= restartMin {
		p.restart(rec)
	} else if p.out.Pos() >= p.recycleAt {
		p.recycle(rec)
	}
	if p.outWarm < size {
		to := p.out.Offset() + rec
		if len(b) >= warmMin {
			to = size
		}
		if to > p.outWarm {
			p.outWarm = warmTo(p.outR, p.outWarm, to, unix.MADV_POPULATE_WRITE)
		}
	}
	space, err := p.waitSpace(min(rec, size))
	if err != nil {
		return err
	}
	if len(b) <= firstPiece && space >= rec {
		// Sealed whole: a receiver polling the record's first word reads
		// all of it without waiting for head.
		if stream {
			p.out.WriteRecordStream(&rh, b)
		} else {
			p.out.WriteRecord(&rh, b)
		}
		p.out.Publish()
		p.peerBell.Ring()
		return nil
	}
	p.out.WriteHeader(&rh)
	space -= ring.HeaderSize
	written := uint64(0)
	for {
		// The first pieces of a record are published small, so that the
		// receiver copies while the rest is written (a mid-size message
		// costs about one copy's time, not two); then a chunk at a time.
		piece := p.chunk
		if written < firstPieces {
			piece = min(piece, firstPiece)
		}
		k := min(space, uint64(len(b)), piece)
		if stream {
			p.out.WriteStream(b[:k])
		} else {
			p.out.Write(b[:k])
		}
		b = b[k:]
		space -= k
		written += k
		if len(b) == 0 {
			if space < pad {
				p.out.Publish()
				p.peerBell.Ring()
				if _, err = p.waitSpace(pad); err != nil {
					return err
				}
			}
			p.out.Write(zeroPad[:pad])
			p.out.Publish()
			p.peerBell.Ring()
			return nil
		}
		if space == 0 || k == piece {
			p.out.Publish()
			p.peerBell.Ring()
		}
		if space == 0 {
			if space, err = p.waitSpace(min(uint64(len(b)), p.chunk)); err != nil {
				return err
			}
		}
	}
}

// restartMin is the smallest payload before which the producer looks
// whether it can restart the ring (restart): reading the consumer's tail
// costs a cache line from the other process, which only a large record
// repays.
const restartMin = 64 << 10

// restart moves the producer to the start of the ring's next lap
// (ring.Producer.Restart) when the ring is empty and a record of n bytes
// fits between that start and where the consumer stands. A stream of
// messages that each find the ring drained — the segments of an
// all-reduce, a pipeline's activations — then cycles through the first
// part of the ring, which both processes' caches still hold, instead of
// through all of it: with 8 MiB rings on the machine of BENCHMARKS.md, a
// lap of the whole ring left each record to come from memory. Called
// with wmu held, between records.
func (p *peer) restart(n uint64) bool {
	if off := p.out.Offset(); off < n {
		return false // at the start of a lap already, or the record would wait for the mark to be passed
	}
	if s, err := p.out.Space(); err != nil || s != p.outR.Size() {
		return false // not empty (or corrupt: waitSpace reports it)
	}
	p.out.Restart()
	p.restarts++
	return true
}

// recycle is restart for a record of n bytes below restartMin, which
// repays reading the consumer's tail only now and then: once the producer
// is recycleMin bytes into a lap, and then every recycleEvery bytes while
// the ring is not empty. Small records — a ping-pong's, a latency-bound
// all-reduce's — then stay in the first part of the ring, whose pages
// both processes have mapped and written and whose lines their caches
// hold, instead of cycling through all of it. Without it, on a virtual
// machine where the first write to a page cost about 5 µs, the first lap
// of 8 MiB rings — 512 all-reduces of 4096 floats between 2 ranks, 16 KiB
// records — took about 45 µs per all-reduce instead of 5. Called with wmu
// held, between records.
func (p *peer) recycle(n uint64) {
	if p.out.Offset() < recycleMin {
		p.recycleAt = p.out.Pos() + recycleMin - p.out.Offset()
		return
	}
	if p.restart(n) || p.recycleAsked && p.drained(n) {
		if p.recycleAsked {
			p.recycleAsked = false
			p.outR.SetSpaceWait(false)
		}
		return
	}
	// The consumer may have taken every record and left their space to
	// hand back later (settle), as it does when it replies at once: ask it,
	// as a sender waiting for space does, to hand it back as it takes them,
	// and wait for the last record at the next look (drained). Two ranks
	// that send to each other before they receive (an all-reduce's
	// exchange) would otherwise never see the ring drained: each sends its
	// next record while the other still reads the last.
	p.recycleAt = p.out.Pos() + recycleEvery
	p.recycleAsked = true
	p.outR.SetSpaceWait(true)
}

// drainWait bounds how long recycle waits for the consumer to finish the
// records in the ring.
const drainWait = 20 * time.Microsecond

// drained waits up to drainWait for the consumer to release everything in
// the ring, when what is left is at most recycleEvery bytes, and then
// restarts the lap for a record of n bytes; it reports whether it did.
// Called with wmu held, between records.
func (p *peer) drained(n uint64) bool {
	s, err := p.out.Space()
	if err != nil || p.outR.Size()-s > recycleEvery {
		return false
	}
	start := nanotime()
	for i := 1; nanotime()-start < int64(drainWait); i++ {
		if i%64 == 0 {
			runtime.Gosched()
		}
		if p.restart(n) {
			return true
		}
	}
	return false
}

// zeroPad is the padding after a payload (ring.Align).
var zeroPad [ring.Align]byte

// warmTo maps the pages of r's data area from offset from (where the
// pages are mapped already) to at least offset to into this process at
// once (advice MADV_POPULATE_WRITE for the producer, which also allocates
// them, READ for the consumer), in steps of warmChunk; it returns how far
// they are mapped now. Each side maps the whole ring the first time a
// record of warmMin bytes or more goes through it, and until then the
// part ahead of where it writes or reads: both go through a ring from its
// start, lap after lap, and a lap restart goes back to it. Left to first
// touch, each fresh 4 KiB page costs each side a page fault during the
// ring's first lap, which made the first 32 all-reduces of 256 KiB three
// to six times slower than the rest. On a virtual machine where a fault
// on a fresh page cost 12-18 µs and a read fault on a page the peer
// allocated 5-9 µs, the advice cost 1.3-2 µs and 0.3-0.5 µs a page (the
// first write to a page still cost about 5 µs there). Mapping every
// region at setup instead (MAP_POPULATE) would allocate all n(n-1)/2
// pairs' rings, most of which a ring all-reduce never uses. The advice
// needs Linux 5.14; on older kernels, or if it fails, the pages come by
// faults as before.
func warmTo(r *ring.Ring, from, to uint64, advice int) uint64 {
	size := r.Size()
	if to <= from {
		return from
	}
	to = min((to+warmChunk-1)/warmChunk*warmChunk, size)
	_ = unix.Madvise(r.DataBytes()[from:to], advice)
	return to
}

// sendRemote writes a remote record for b and waits until the peer has
// read b from this process's memory. Called with wmu held.
func (p *peer) sendRemote(tag uint32, h transport.Header, b []byte) error {
	rh := ring.Header{Tag: tag, Len: uint64(len(b)), Meta: h, Remote: true}
	p.pin.Pin(&b[0]) // b cannot move (nor, escaping, live on a stack) meanwhile
	defer p.pin.Unpin()
	binary.LittleEndian.PutUint64(p.desc[:], uint64(uintptr(unsafe.Pointer(&b[0]))))
	if _, err := p.waitSpace(ring.HeaderSize + ring.RemoteSize + ring.RemotePad); err != nil {
		return err
	}
	p.out.WriteHeader(&rh)
	p.out.Write(p.desc[:])
	p.out.Write(zeroPad[:ring.RemotePad])
	p.out.Publish()
	p.peerBell.Ring()
	p.remoteSent++
	return p.waitAck(p.remoteSent)
}

// waitAck waits until the peer has acknowledged n remote records. Called
// with wmu held.
func (p *peer) waitAck(n uint64) error {
	start := time.Now()
	parked := false
	for i := 0; ; i++ {
		a := p.outR.Ack()
		if a < p.ackSeen || a > p.remoteSent {
			return p.corrupt("send", fmt.Errorf("%w: ack %d outside [%d, %d]", ring.ErrCorrupt, a, p.ackSeen, p.remoteSent))
		}
		p.ackSeen = a
		if a >= n {
			if i > 0 {
				p.wspin.done(!parked)
			}
			return nil
		}
		if err := p.goneErr("send"); err != nil {
			return err
		}
		if p.spinning(i, start) {
			p.wspin.pause(start)
			continue
		}
		parked = true
		p.ackWaiting.Store(true)
		p.outR.SetAckWait(true)
		if p.outR.Ack() < n {
			select {
			case <-p.ackCh:
			case <-p.goneCh:
			case <-p.lostCh:
			case <-p.t.stop:
			}
		}
		p.outR.SetAckWait(false)
		p.ackWaiting.Store(false)
		start = time.Now()
	}
}

// waitSpace waits until at least want bytes of the outbound ring are free
// and returns how many are. The consumer's tail is read only when the one
// last seen leaves too little room. Called with wmu held.
func (p *peer) waitSpace(want uint64) (uint64, error) {
	if p.writes++; p.writes%recheckEvery != 0 {
		if s := p.out.Known(); s >= want {
			return s, nil
		}
	}
	return p.waitSpaceSlow(want)
}

func (p *peer) waitSpaceSlow(want uint64) (uint64, error) {
	start := time.Now()
	parked := false
	for i := 0; ; i++ {
		s, err := p.out.Space()
		if err != nil {
			return 0, p.corrupt("send", err)
		}
		if s >= want {
			if i > 0 {
				p.wspin.done(!parked)
			}
			return s, nil
		}
		if err := p.goneErr("send"); err != nil {
			return 0, err
		}
		if p.spinning(i, start) {
			p.wspin.pause(start)
			continue
		}
		parked = true
		p.spaceWaiting.Store(true)
		p.outR.SetSpaceWait(true)
		if s, err = p.out.Space(); err == nil && s < want {
			select {
			case <-p.spaceCh:
			case <-p.goneCh:
			case <-p.lostCh:
			case <-p.t.stop:
			}
		}
		p.outR.SetSpaceWait(false)
		p.spaceWaiting.Store(false)
		start = time.Now()
	}
}

// acquire waits until the peer can queue n more bytes from us and reserves
// them. Nothing is reserved when it returns an error. Called with wmu
// held, which it lets go of while it waits and holds again when it
// returns.
func (p *peer) acquire(ctx context.Context, n int) error {
	if p.wdead {
		return errClosed("send")
	}
	if p.window <= 0 {
		return nil
	}
	if p.sends++; p.sends%recheckEvery != 0 && int64(p.sent-p.freedSeen)+int64(n) <= p.window {
		// Room by the credit last seen: the peer's cache line is left
		// alone (and checked every recheckEvery sends all the same).
		p.sent += uint64(n)
		return nil
	}
	registered, waited := false, false
	deregister := func() {
		if p.creditWaiters.Add(-1) == 0 && !p.wdead {
			p.outR.SetCreditWait(false)
		}
	}
	for {
		if p.wdead {
			return errClosed("send")
		}
		f := p.outR.Freed()
		if f < p.freedSeen || f > p.sent {
			if registered {
				deregister()
			}
			return p.corrupt("send", fmt.Errorf("%w: credit %d outside [%d, %d]", ring.ErrCorrupt, f, p.freedSeen, p.sent))
		}
		p.freedSeen = f
		inflight := int64(p.sent - f)
		if inflight == 0 || inflight+int64(n) <= p.window {
			if registered {
				deregister()
			}
			p.sent += uint64(n)
			if waited && inflight+int64(n) < p.window {
				signal(p.credit) // more waiters than wakeCap: pass the wake-up on
			}
			return nil
		}
		if !registered {
			// Ask for a doorbell, then look again before sleeping.
			registered = true
			p.creditWaiters.Add(1)
			p.outR.SetCreditWait(true)
			continue
		}
		p.wmu.Unlock()
		var err error
		select {
		case <-p.credit:
		case <-ctx.Done():
			err = fmt.Errorf("shm: send to rank %d: %w", p.rank, ctx.Err())
		case <-p.goneCh:
			err = p.goneErr("send")
		case <-p.lostCh:
			err = p.goneErr("send")
		case <-p.t.stop:
			err = errClosed("send")
		}
		p.wmu.Lock()
		if err != nil {
			deregister()
			return err
		}
		waited = true
	}
}

// consumed returns n bytes of credit to the peer: the application took them.
func (p *peer) consumed(n int) {
	if n == 0 || p.t.cfg.queueLimit == 0 {
		return
	}
	p.fmu.Lock()
	if !p.fdead {
		p.credited(n)
	}
	p.fmu.Unlock()
}

// credited is consumed without fmu, for a caller that keeps the memory
// mapped otherwise: one under fmu with the link alive, or a receiver that
// holds rmu with it alive (rdead false; unmap takes rmu before it unmaps).
func (p *peer) credited(n int) {
	if n == 0 || p.t.cfg.queueLimit == 0 {
		return
	}
	p.inR.AddFreed(uint64(n))
	if p.inR.CreditWait() {
		p.peerBell.Ring()
	}
}

// ---- receive side ----

// errGone ends the reader when the peer said goodbye and the ring is drained.
var errGone = errors.New("peer said goodbye")

// errPeerExited: the peer's process is gone (a remote read found no such
// process); its socket's end of file is on the way.
var errPeerExited = errors.New("peer process exited")

// pollOutbound wakes this rank's senders waiting for ring space or credit
// if the peer's consumer moved. The reader and polling receivers call it
// as they wait; one at a time does the work.
func (p *peer) pollOutbound() {
	if !p.spaceWaiting.Load() && !p.ackWaiting.Load() && p.creditWaiters.Load() == 0 {
		return
	}
	if !p.omu.TryLock() {
		return
	}
	defer p.omu.Unlock()
	if p.spaceWaiting.Load() {
		if t := p.outR.TailHint(); t != p.lastTail {
			p.lastTail = t
			signal(p.spaceCh)
		}
	}
	if p.ackWaiting.Load() {
		if a := p.outR.Ack(); a != p.lastAck {
			p.lastAck = a
			signal(p.ackCh)
		}
	}
	if n := p.creditWaiters.Load(); n > 0 {
		if f := p.outR.Freed(); f != p.lastFreed {
			p.lastFreed = f
			wake(p.credit, int(n))
		}
	}
}

// wait waits until at least need bytes can be read from the inbound ring,
// polling briefly and then parking on this rank's doorbell.
func (p *peer) wait(need uint64) (uint64, error) {
	if a := p.in.Known(); a >= need {
		return a, nil // a whole record's seal, or the head seen before
	}
	return p.waitSlow(need)
}

func (p *peer) waitSlow(need uint64) (uint64, error) {
	start := time.Now()
	parked := false
	for i := 0; ; i++ {
		a, err := p.in.Avail()
		if err != nil {
			return 0, err
		}
		if a >= need {
			if i > 0 {
				p.sspin.done(!parked)
			}
			return a, nil
		}
		p.pollOutbound()
		if p.t.closing.Load() || p.lost.Load() {
			return 0, errClosed("recv")
		}
		if p.gone.Load() {
			// The goodbye came after everything the peer wrote.
			if a, err = p.in.Avail(); err != nil || a >= need {
				return a, err
			}
			return a, errGone
		}
		if p.spinning(i, start) {
			if p.sspin.pause(start) {
				start = time.Now() // see busyYield
			}
			continue
		}
		parked = true
		seq := p.myBell.Prepare()
		a, err = p.in.Avail()
		if err == nil && a < need && !p.t.closing.Load() && !p.lost.Load() && !p.gone.Load() {
			p.pollOutbound()
			p.myBell.Wait(seq, parkMax)
		}
		p.myBell.Done()
		start = time.Now()
	}
}

// release hands consumed ring space back to the peer.
func (p *peer) release() {
	if p.in.Release() && p.inR.SpaceWait() {
		p.peerBell.Ring()
	}
}

// readInto fills dst from the inbound ring, chunk by chunk as it arrives.
// It hands each chunk's space back to the peer but the last: the caller
// releases the record's end once it has read all of it (one store of the
// tail per small record, not one per part of it).
func (p *peer) readInto(dst []byte) error {
	if n := uint64(len(dst)); n <= p.chunk && n <= p.in.Known() { // in the ring already: one piece
		p.in.Read(dst)
		return nil
	}
	for len(dst) > 0 {
		a, err := p.wait(1)
		if err != nil {
			return err
		}
		k := min(a, uint64(len(dst)), p.chunk)
		p.in.Read(dst[:k])
		dst = dst[k:]
		if len(dst) > 0 {
			p.release()
		}
	}
	return nil
}

// skip drops n bytes from the inbound ring; like readInto, it leaves the
// release of the last piece to the caller.
func (p *peer) skip(n uint64) error {
	if n <= p.in.Known() {
		p.in.Skip(n)
		return nil
	}
	for n > 0 {
		a, err := p.wait(1)
		if err != nil {
			return err
		}
		k := min(a, n)
		p.in.Skip(k)
		n -= k
		if n > 0 {
			p.release()
		}
	}
	return nil
}

// readLoop delivers the records of the inbound ring until the peer leaves,
// is lost or the transport closes. It waits without the consumer lock
// (idle), so that a receiver polling the ring can deliver in the meantime,
// and takes it to deliver every record that has arrived.
func (p *peer) readLoop() {
	t := p.t
	defer t.wg.Done()
	for {
		if t.cfg.remoteMin > 0 && p.pid > 0 {
			p.rmu.Lock()
			if !p.remoteProbed {
				p.probeRemote()
			}
			p.rmu.Unlock()
		}
		if err := p.idle(); err != nil {
			p.rmu.Lock()
			p.readEnded(err, nil, true)
			p.rmu.Unlock()
			return
		}
		p.rmu.Lock()
		ok := p.drain()
		p.rmu.Unlock()
		if !ok {
			return
		}
	}
}

// idle waits, without the consumer lock, until a record header may have
// arrived, and returns an error when the transport closes or the peer is
// lost, or errGone once the peer said goodbye and everything it wrote was
// read. While receivers poll the ring themselves it keeps out of their
// way, blocked until the last one stops (or a record needs the reader):
// otherwise it polls briefly, then parks on this rank's doorbell.
func (p *peer) idle() error {
	start := time.Now()
	begun, parked := start, false
	// Poll until patient (this wait's patience from its beginning), and
	// for the spin since start (which a pause that let other goroutines
	// run moves on, see busyYield), before parking.
	patient := begun.Add(time.Duration(p.patience.Load()))
	polled := begun // when the last poll read the clock
	for i := 0; ; i++ {
		if p.t.closing.Load() || p.lost.Load() {
			return errClosed("recv")
		}
		if p.gone.Load() {
			// The goodbye came after everything the peer wrote.
			if p.inR.HeadHint()-p.readPos() >= ring.HeaderSize {
				return nil
			}
			return errGone
		}
		if p.pollers.active() && !p.needed.Load() {
			select {
			case <-p.kick:
			case <-p.t.stop:
			case <-p.lostCh:
			case <-p.goneCh:
			}
			start, i = time.Now(), 0
			begun, parked, polled = start, false, start
			patient = begun.Add(time.Duration(p.patience.Load()))
			continue
		}
		if p.arrived() || (i%headEvery == headEvery-1 && p.inR.HeadHint()-p.readPos() >= ring.HeaderSize) {
			if i > 0 {
				p.rspin.done(!parked)
				// The wait's length as of the last time it read the clock
				// (not in its first polls: such a wait was as good as none).
				w := polled.Sub(begun)
				p.patience.Store(int64(nextPatience(time.Duration(p.patience.Load()), p.t.cfg.spin, w, parked)))
			}
			return nil
		}
		p.pollOutbound()
		if i >= 4 {
			polled = time.Now()
		}
		if i < 4 || polled.Before(patient) || (p.t.cfg.spin > 0 && polled.Sub(start) < p.t.cfg.spin) {
			if p.rspin.pause(start) {
				start = time.Now() // see busyYield
			}
			continue
		}
		parked = true
		seq := p.myBell.Prepare()
		if !p.arrived() && p.inR.HeadHint()-p.readPos() < ring.HeaderSize && !p.pollers.active() &&
			!p.t.closing.Load() && !p.lost.Load() && !p.gone.Load() {
			p.pollOutbound()
			p.myBell.Wait(seq, parkMax)
		}
		p.myBell.Done()
		start = time.Now()
		polled = start
		// Woken without a record (or by the bound on the park): a long
		// wait, worth no more than the configured spin from now on.
		patient = time.Time{}
	}
}

// maxPatience bounds how long the idle reader polls before it parks.
const maxPatience = 4 * time.Millisecond

// nextPatience returns how long the idle reader is to poll before it parks
// (its patience), after a wait of w that parked or not, from patience d:
// never less than the configured spin, never more than maxPatience (or
// than the spin, if it is longer).
//
// Waking a parked process costs tens of microseconds (40-70 µs at the
// median on a virtual machine, where the woken CPU must first be brought
// out of its idle state), and the wake-up lies on the path of every
// message that ends a wait. Where waits come at a steady rhythm, a few
// milliseconds each (a pipeline stage waiting for its neighbour's next
// micro-batch, a rank for the slowest in a collective), that is paid
// on every one. So a wait that parked but ended within maxPatience makes
// the reader poll twice as long as that wait from then on, and a wait
// served while polling keeps its patience at least at twice its length
// (letting it shrink by a sixteenth otherwise, as the waits get shorter).
// A wait longer than maxPatience, such as an idle rank's, halves it: an
// idle rank parks again within a few waits.
func nextPatience(d, spin, w time.Duration, parked bool) time.Duration {
	if spin <= 0 {
		return 0 // parks at once (WithSpin(0))
	}
	switch {
	case !parked:
		d = max(d-d/16, 2*w)
	case w <= maxPatience:
		d = max(d, 2*w)
	default:
		d /= 2
	}
	return min(max(d, spin), max(spin, maxPatience))
}

// headEvery is how many polls of a record's seal go by between looks at
// the producer's head, which catch a header published without its seal (a
// corrupt ring) and otherwise only bring the head's cache line over.
const headEvery = 64

// next is in.Next, which passes a lap mark (ring.Producer.Restart) by
// itself: the tail it moved to is then published at once (release), so
// that the reader's hint (arrived, which reads the published tail) does
// not keep finding the mark. Called with rmu held.
func (p *peer) next(head bool) (bool, error) {
	pos := p.in.Pos()
	ok, err := p.in.Next(head)
	if p.in.Pos() != pos {
		p.release()
	}
	if size := p.inR.Size(); p.inWarm < size {
		// A record below warmMin fits in what is mapped ahead.
		if to := p.in.Pos()&(size-1) + warmChunk/2; to > p.inWarm {
			p.inWarm = warmTo(p.inR, p.inWarm, to, unix.MADV_POPULATE_READ)
		}
	}
	return ok, err
}

// arrived reports, without the consumer lock, whether the next record's
// header is in place: its seal, on the cache line the record comes in,
// rather than the producer's head, whose line the producer would then
// have to take back at its next publish.
//
// It reads the tail this rank published last (release), which is where
// the receivers stand whenever they do not hold rmu, or the start of the
// record the last one took and left owed (settle): then it finds that
// record's seal, and the reader settles it when it looks. A private copy
// of the tail would cost one more locked store per message.
func (p *peer) arrived() bool { return p.inR.SealedAt(p.readPos()) }

// readPos is the inbound ring's tail as this rank last published it.
func (p *peer) readPos() uint64 { return p.inR.TailHint() }

// drain delivers every record whose header has arrived, waiting for the
// rest of one that is still coming; while receivers poll, only the one
// they left to it. It reports false if the link ended (readEnded has run).
// Called with rmu held.
func (p *peer) drain() bool {
	p.settle()
	for k := 0; ; k++ {
		if k == 0 {
			p.needed.Store(false)
		} else if p.pollers.active() {
			return true // the pollers take it from here
		}
		ok, err := p.next(true)
		if err != nil {
			p.readEnded(err, nil, true)
			return false
		}
		if !ok {
			return true
		}
		pos := p.in.Pos()
		h, err := ring.ParseHeader(p.in.Header(), uint64(p.t.cfg.maxFrame), pos)
		p.in.Skip(ring.HeaderSize)
		if err != nil {
			p.readEnded(err, nil, false)
			return false
		}
		if !p.deliver(h, false) {
			return false
		}
	}
}

// progress delivers, on the calling goroutine, the next record whose
// header has arrived (a waiting receiver's poll: no goroutine switch),
// waiting for the rest of it as the reader would: the receiver has
// nothing else to do, and a message that streams in is copied as it comes.
// One record at a time: the receiver may post the receive the next one is
// for, which is then filled directly instead of queued. A remote record,
// the ring's first large one or anything invalid it leaves to the reader
// goroutine, which it wakes. It reports whether it delivered one.
func (p *peer) progress() bool {
	if !p.rmu.TryLock() {
		return false
	}
	defer p.rmu.Unlock()
	if p.rdead {
		return false
	}
	if !p.remoteProbed && p.t.cfg.remoteMin > 0 && p.pid > 0 {
		p.probeRemote()
	}
	p.pollOutbound()
	p.settle()
	p.polls++
	ok, err := p.next(p.polls%headEvery == 0)
	if err != nil || !ok {
		if err != nil {
			p.needReader()
		}
		return false
	}
	h, err := ring.ParseHeader(p.in.Header(), uint64(p.t.cfg.maxFrame), p.in.Pos())
	if err != nil || h.Remote || (p.inWarm < p.inR.Size() && h.Len >= warmMin) {
		p.needReader()
		return false
	}
	p.in.Skip(ring.HeaderSize)
	return p.deliver(h, true)
}

// takeNext is a receive's fast path: the waiting goroutine polls the
// inbound ring itself, as progress does, but takes the next record for tag
// without going through the mailbox (no posted receive to claim and
// complete, no channel to wake). It does so only while the mailbox holds
// nothing for (peer, tag) and no other receive waits there (Mailbox.Quiet,
// checked again whenever a record is delivered to the mailbox meanwhile),
// so messages keep their order. Records for other tags are delivered to
// the mailbox as they come. When the next record is for tag, is read from
// the ring (not remote, not the ring's first large one) and its length
// suits the receive (at most limit bytes, or exactly limit when exact),
// takeNext returns its header with rmu held and the ring positioned at the
// payload; the caller reads it and calls finishTake. Otherwise, and when
// ctx ends, the link ends or the spin budget passes without a record, it
// returns false and the caller takes the mailbox's path, which handles
// every other case (and reports every error).
func (p *peer) takeNext(ctx context.Context, tag uint32, limit uint64, exact bool) (ring.Header, bool) {
	t := p.t
	if p.pollers.begin() {
		p.pspin.begin()
	}
	took := false
	defer func() {
		if !took {
			p.endPoll(false, false)
		}
	}()
	checked, seen := false, uint64(0)
	for i := 1; ; i++ {
		if p.rmu.TryLock() {
			if p.rdead {
				p.rmu.Unlock()
				return ring.Header{}, false
			}
			if !checked || p.deliveries != seen {
				if !t.box.Quiet(p.rank, tag) {
					p.rmu.Unlock()
					return ring.Header{}, false
				}
				checked, seen = true, p.deliveries
			}
			if !p.remoteProbed && t.cfg.remoteMin > 0 && p.pid > 0 {
				p.probeRemote()
			}
			p.pollOutbound()
			p.settle()
			p.polls++
			ok, err := p.next(p.polls%headEvery == 0)
			if err == nil && ok {
				h, err := ring.ParseHeader(p.in.Header(), uint64(t.cfg.maxFrame), p.in.Pos())
				if err != nil || h.Remote || (p.inWarm < p.inR.Size() && h.Len >= warmMin) {
					p.needReader()
					p.rmu.Unlock()
					return ring.Header{}, false
				}
				p.in.Skip(ring.HeaderSize)
				if h.Tag == tag && (h.Len == limit || (!exact && h.Len < limit)) {
					p.pspin.took()
					took = true
					return h, true
				}
				// Another receive's record, or one this receive is to
				// refuse (the mailbox's path reports it).
				ok := p.deliver(h, true)
				p.rmu.Unlock()
				if !ok || h.Tag == tag {
					return ring.Header{}, false
				}
				p.pspin.served()
				continue
			}
			if err != nil {
				p.needReader()
				p.rmu.Unlock()
				return ring.Header{}, false
			}
			p.rmu.Unlock()
		}
		if i%8 == 0 {
			p.pspin.idle()
		}
		if i%64 == 0 {
			now := nanotime()
			if ctx.Err() != nil || t.closing.Load() || p.lost.Load() || p.gone.Load() ||
				now-p.pspin.start(now) > int64(t.cfg.spin) {
				return ring.Header{}, false
			}
			runtime.Gosched()
		}
	}
}

// finishTake ends a receive that takeNext let through, once the caller
// has read the payload (err: why it could not): it drops the padding,
// releases rmu, returns the credit and ends the receive's polling. It
// reports whether the link is still whole; when it is not, readEnded has
// run, and the mailbox's path reports the error.
func (p *peer) finishTake(h ring.Header, err error) bool {
	if err == nil {
		err = p.skip(ring.Pad(h.Len))
	}
	if err != nil {
		p.readEnded(err, nil, false)
		p.rmu.Unlock()
		p.endPoll(false, false)
		return false
	}
	more := p.inR.SealedAt(p.in.Pos())
	p.owed += int(h.Len)
	if h.Len > p.owedMax || p.inR.SpaceWait() || p.inR.CreditWait() {
		p.settle()
	} else {
		p.owings++
	}
	p.rmu.Unlock()
	p.endPoll(true, more)
	return true
}

// owedMax bounds the records whose ring space and credit a receive that
// took them leaves for later (settle): the next receive's first poll, or
// the reader once receives stop (within two lazyDelay periods), hands them
// back. The receiver then replies without the two locked stores on its
// way, and the peer, which is waiting for that reply, seldom needs either
// before. Larger records, those above a sixteenth of the ring or of the
// queue limit (peer.owedMax), and any while the peer waits for space or
// credit, settle at once.
const owedMax = 16 << 10

// settle hands back the ring space and credit that receives which took
// their records left owed (finishTake). Every consumer of the ring calls it
// before it looks for the next record: a lap mark is passed only with
// everything before it released. Called with rmu held, the link alive.
func (p *peer) settle() {
	p.release()
	if p.owed > 0 {
		p.credited(p.owed)
		p.owed = 0
	}
}

// endPoll ends a goroutine's polling of the ring: the last poller to stop
// wakes the reader — at once, unless it stops because it took the record
// it waited for (took), nothing else has arrived (more) and no other
// receive from the peer waits. Then the next receive most likely comes
// before the next record, and polls for it itself: waking the reader now
// would only make it run to find that out (a goroutine switch and a park
// per message). It is woken once a whole lazyDelay has passed without a
// receive polling instead (lazyWake), in case none comes: records that
// arrive meanwhile wait in the ring, which the next receive reads first,
// or until the reader drains them. Neither end reads the clock, which
// costs as much as the rest of a poll on a virtual machine: the timer
// counts polls (pollCount), and a take finds it armed already.
func (p *peer) endPoll(took, more bool) {
	if !p.pollers.end() {
		return
	}
	if !took || more || p.t.box.Waiting(p.rank) {
		signal(p.kick)
		return
	}
	if !p.lazyArmed.Load() && !p.lazyArmed.Swap(true) { // a swap is a locked instruction
		p.lazyKick.Reset(lazyDelay)
	}
}

// lazyDelay is the period of the timer that wakes the reader once receives
// stop taking their records from the ring: the reader is woken between one
// and two periods after the last receive that polled.
const lazyDelay = 50 * time.Microsecond

// lazyWake is lazyKick's function: it wakes the reader if no receive has
// begun to poll since it last ran (and none polls now), and looks again a
// period later otherwise.
func (p *peer) lazyWake() {
	p.lazyArmed.Store(false)
	if p.pollers.active() {
		return // their endPoll wakes the reader or arms the timer again
	}
	if n := p.pollers.begun(); n != p.lazySeen.Load() {
		p.lazySeen.Store(n)
		if !p.lazyArmed.Swap(true) {
			p.lazyKick.Reset(lazyDelay)
		}
		return
	}
	signal(p.kick)
}

// needReader wakes the reader for a record the pollers leave to it,
// whether it waits for the pollers (kick) or is parked on its doorbell.
func (p *peer) needReader() {
	if !p.needed.Load() {
		p.needed.Store(true)
	}
	signal(p.kick)
	p.myBell.Ring()
}

// deliver hands the record h, whose header was just read, to its posted
// receive or queues it. inline says the caller is a polling receiver. It reports false if the link ended (readEnded
// has run). Called with rmu held.
func (p *peer) deliver(h ring.Header, inline bool) bool {
	t := p.t
	p.deliveries++
	if size := p.inR.Size(); p.inWarm < size && h.Len >= warmMin && !h.Remote {
		p.inWarm = warmTo(p.inR, p.inWarm, size, unix.MADV_POPULATE_READ)
	}
	m := transport.Message{Header: h.Meta}
	if h.Remote {
		return p.readRemoteRecord(h)
	}
	var post *mailbox.Post[transport.Message]
	if inline {
		post = t.box.Claim(p.rank, h.Tag)
	} else {
		post = p.claim(h)
	}
	if post != nil {
		n := int(h.Len)
		var err error
		switch {
		case !fits(post, n):
			err = p.skip(h.Len)
		case post.Combine != nil:
			err = p.combineFrom(post.Dst[:n], post.Unit, post.Combine)
		default:
			err = p.readInto(post.Dst[:n])
		}
		if err == nil {
			err = p.skip(ring.Pad(h.Len))
		}
		if err != nil {
			p.readEnded(err, post, false)
			return false
		}
		p.release()
		if n > len(post.Dst) {
			t.box.Complete(post, m, n, transport.TooLong(p.rank, n, len(post.Dst)))
		} else {
			t.box.Complete(post, m, n, nil)
		}
		p.consumed(n)
		if n >= yieldMin && !inline {
			// Let the receiver run before the next record: it may
			// post the receive that record is for (a pipelined
			// collective's next segment), which saves a copy.
			runtime.Gosched()
		}
		return true
	}
	buf := bufpool.Default.Get(int(h.Len))
	err := p.readInto(buf)
	if err == nil {
		err = p.skip(ring.Pad(h.Len))
	}
	if err != nil {
		bufpool.Default.Put(buf)
		p.readEnded(err, nil, false)
		return false
	}
	p.release()
	m.Payload = buf
	if err := t.box.Put(t.ctx, p.rank, h.Tag, m, len(buf)); err != nil {
		bufpool.Default.Put(buf) // closing or lost
	} else if len(buf) >= yieldMin && !inline {
		runtime.Gosched()
	}
	return true
}

// claim returns the receive posted for the record h, if any. For a large
// record it lets the application's goroutines run once before giving up:
// one may be about to post it (with few Ps, the reader can get the CPU
// between a receiver waking and its next receive).
func (p *peer) claim(h ring.Header) *mailbox.Post[transport.Message] {
	if post := p.t.box.Claim(p.rank, h.Tag); post != nil || h.Len < yieldMin {
		return post
	}
	runtime.Gosched()
	return p.t.box.Claim(p.rank, h.Tag)
}

// fits reports whether an n-byte message is delivered into post's buffer:
// it fits, and a combining receive takes exactly its length.
func fits(post *mailbox.Post[transport.Message], n int) bool {
	return n <= len(post.Dst) && (post.Combine == nil || n == len(post.Dst))
}

// combineFrom merges the next len(dst) bytes of the inbound ring into dst
// with combine, in place in the ring, piece by piece as they arrive; every
// piece is a whole number of unit-byte elements. An element split by the
// end of the ring or by what the producer has published so far is
// gathered in a buffer first: the reader always takes everything
// available, as the producer may wait for the whole ring to drain.
func (p *peer) combineFrom(dst []byte, unit int, combine func(dst, src []byte)) error {
	u := uint64(unit)
	e := p.elemBuf(unit)
	have := 0 // bytes of a split element in e
	for len(dst) > 0 {
		a, err := p.wait(1)
		if err != nil {
			return err
		}
		piece := p.in.Peek(min(a, uint64(len(dst)-have), p.chunk))
		if have > 0 || uint64(len(piece)) < u {
			k := min(unit-have, int(a))
			p.in.Read(e[have : have+k])
			p.release()
			if have += k; have == unit {
				combine(dst[:unit], e)
				dst, have = dst[unit:], 0
			}
			continue
		}
		k := uint64(len(piece)) / u * u
		combine(dst[:k], piece[:k])
		p.in.Skip(k)
		dst = dst[k:]
		p.release()
	}
	return nil
}

// elemBuf returns a reader-owned buffer of n bytes.
func (p *peer) elemBuf(n int) []byte {
	if cap(p.elem) < n {
		p.elem = make([]byte, n)
	}
	return p.elem[:n]
}

// remotePiece is how much of a remote record a combining receive reads at
// a time, into a reader-owned buffer that stays in cache, before combining
// it.
const remotePiece = 128 << 10

// combineRemote merges len(dst) bytes at addr in the peer's memory into dst
// with combine, a piece at a time.
func (p *peer) combineRemote(dst []byte, addr uint64, unit int, combine func(dst, src []byte)) error {
	step := max(remotePiece/unit, 1) * unit
	if cap(p.scratch) < step {
		p.scratch = make([]byte, step)
	}
	for len(dst) > 0 {
		k := min(step, len(dst))
		s := p.scratch[:k]
		if err := p.readRemote(s, addr); err != nil {
			return err
		}
		combine(dst[:k], s)
		dst = dst[k:]
		addr += uint64(k)
	}
	return nil
}

// probeRemote tries to read the peer's probe word from its memory and, if
// that works, tells the peer it may send remote records.
func (p *peer) probeRemote() {
	addr, val := p.inR.Probe()
	if addr == 0 {
		return // the peer has not published it yet
	}
	p.remoteProbed = true
	got := make([]byte, 8)
	if p.readRemote(got, addr) == nil && binary.LittleEndian.Uint64(got) == val {
		p.remoteOK = true
		p.inR.SetRemoteOK()
	}
}

// readRemote copies len(dst) bytes at addr in the peer's memory into dst.
func (p *peer) readRemote(dst []byte, addr uint64) error {
	defer func() { p.liov[0] = unix.Iovec{} }() // do not retain dst
	for len(dst) > 0 {
		p.liov[0] = unix.Iovec{Base: &dst[0]}
		p.liov[0].SetLen(len(dst))
		p.riov[0] = unix.RemoteIovec{Base: uintptr(addr), Len: len(dst)}
		n, err := unix.ProcessVMReadv(p.pid, p.liov[:], p.riov[:], 0)
		if err == unix.EINTR {
			continue
		}
		if err == unix.ESRCH {
			return errPeerExited
		}
		if err != nil || n <= 0 {
			return fmt.Errorf("%w: reading %d bytes at %#x of the peer's memory: %v", ring.ErrCorrupt, len(dst), addr, err)
		}
		dst = dst[n:]
		addr += uint64(n)
	}
	return nil
}

// readRemoteRecord delivers the remote record h: its body in the ring is
// the address of the payload in the peer's memory, which is read from
// there, then acknowledged. It reports whether the link is still usable.
func (p *peer) readRemoteRecord(h ring.Header) bool {
	t := p.t
	if !p.remoteOK {
		p.readEnded(fmt.Errorf("%w: a remote record, but this rank never said it can read the peer's memory", ring.ErrCorrupt), nil, false)
		return false
	}
	var d [ring.RemoteSize]byte
	if _, err := p.wait(ring.RemoteSize + ring.RemotePad); err != nil {
		p.readEnded(err, nil, false)
		return false
	}
	p.in.Read(d[:])
	p.in.Skip(ring.RemotePad)
	p.release()
	addr := binary.LittleEndian.Uint64(d[:])
	n := int(h.Len)
	m := transport.Message{Header: h.Meta}
	if post := p.claim(h); post != nil {
		if !fits(post, n) {
			p.ack()
			if n > len(post.Dst) {
				t.box.Complete(post, m, n, transport.TooLong(p.rank, n, len(post.Dst)))
			} else {
				t.box.Complete(post, m, n, nil)
			}
		} else {
			var err error
			if post.Combine != nil {
				err = p.combineRemote(post.Dst[:n], addr, post.Unit, post.Combine)
			} else {
				err = p.readRemote(post.Dst[:n], addr)
			}
			if err != nil {
				p.readEnded(err, post, false)
				return false
			}
			p.ack()
			t.box.Complete(post, m, n, nil)
		}
		p.consumed(n)
		return true
	}
	buf := bufpool.Default.Get(n)
	if err := p.readRemote(buf, addr); err != nil {
		bufpool.Default.Put(buf)
		p.readEnded(err, nil, false)
		return false
	}
	p.ack()
	m.Payload = buf
	if err := t.box.Put(t.ctx, p.rank, h.Tag, m, n); err != nil {
		bufpool.Default.Put(buf)
	}
	return true
}

// ack tells the peer a remote record is done with.
func (p *peer) ack() {
	p.inR.AddAck()
	if p.inR.AckWait() {
		p.peerBell.Ring()
	}
}

// readEnded handles the end of the reader: err says why, post is the
// receive it was filling (completed here), atBoundary whether it stopped
// between records.
func (p *peer) readEnded(err error, post *mailbox.Post[transport.Message], atBoundary bool) {
	t := p.t
	var perr error
	switch {
	case errors.Is(err, errGone):
		perr = &transport.PeerError{Rank: p.rank, Op: "recv", Err: transport.ErrPeerClosed}
		if !atBoundary {
			t.log.Warn("shm: peer left in the middle of a message", "peer", p.rank)
		}
		t.box.CloseSource(p.rank, perr)
	case errors.Is(err, ring.ErrCorrupt):
		p.corrupt("recv", err)
		perr = p.goneErr("recv")
	case errors.Is(err, errPeerExited):
		t.fail(p.rank, fmt.Errorf("%w: %w", transport.ErrPeerLost, err))
		perr = p.goneErr("recv")
	default: // closing or lost
		perr = p.goneErr("recv")
		if perr == nil {
			perr = errClosed("recv")
		}
	}
	if post != nil {
		t.box.Complete(post, transport.Message{}, 0, perr)
	}
}

// corrupt fails the peer for writing something invalid into the shared
// memory and returns the error for operation op.
func (p *peer) corrupt(op string, err error) error {
	p.t.fail(p.rank, fmt.Errorf("%w: %w: %w", transport.ErrPeerLost, ErrProtocol, err))
	if e := p.goneErr(op); e != nil {
		return e
	}
	return &transport.PeerError{Rank: p.rank, Op: op, Err: fmt.Errorf("%w: %w", ErrProtocol, err)}
}

// ctlLoop reads the link's socket: a goodbye, or the end of the peer's
// process (the kernel closes the socket of a process that dies, however
// it dies).
func (p *peer) ctlLoop() {
	t := p.t
	defer t.wg.Done()
	var b [1]byte
	for {
		n, err := p.conn.Read(b[:])
		if err != nil || n == 0 {
			if p.gone.Load() || t.closing.Load() {
				return
			}
			t.fail(p.rank, fmt.Errorf("%w: socket closed without goodbye: %v", transport.ErrPeerLost, err))
			return
		}
		if b[0] != msgBye || p.gone.Load() {
			t.fail(p.rank, fmt.Errorf("%w: %w: unexpected byte %#x on the control socket", transport.ErrPeerLost, ErrProtocol, b[0]))
			return
		}
		p.gone.Store(true)
		p.goneOnce.Do(func() { close(p.goneCh) })
		p.myBell.Force() // the reader drains, then reports the peer closed
		signal(p.kick)
	}
}

// unmap releases the region once nothing can touch it any more: the
// transport's goroutines have exited, and the locks keep the application's
// goroutines out.
func (p *peer) unmap() {
	p.wmu.Lock()
	p.wdead = true
	p.wmu.Unlock()
	p.rmu.Lock()
	p.rdead = true
	p.rmu.Unlock()
	p.fmu.Lock()
	p.fdead = true
	p.fmu.Unlock()
	p.lazyKick.Stop()
	unix.Munmap(p.region)
}

// pollCount counts the application goroutines polling a peer's ring
// (its low 32 bits) and how many polls have begun (its high 32 bits, which
// wrap): one atomic add begins or ends a poll and counts it.
type pollCount struct{ v atomic.Uint64 }

// begin counts a poll in; it reports whether it is the only one.
func (c *pollCount) begin() bool { return uint32(c.v.Add(1<<32|1)) == 1 }

// end counts a poll out; it reports whether it was the last.
func (c *pollCount) end() bool { return uint32(c.v.Add(^uint64(0))) == 0 }

// active reports whether a goroutine polls.
func (c *pollCount) active() bool { return uint32(c.v.Load()) != 0 }

// begun returns how many polls have begun, modulo 1<<32.
func (c *pollCount) begun() uint32 { return uint32(c.v.Load() >> 32) }
