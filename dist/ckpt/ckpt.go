package ckpt

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/errs"
	"github.com/gdist/gdist/internal/options"
	"github.com/gdist/gdist/train/checkpoint"
)

// Errors. Match them with errors.Is.
var (
	// ErrInvalidArgument is matched by the errors of a bad argument or
	// option. It is the value every gdist package exports under this name
	// (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrNoCommonStep means some rank holds a checkpoint but there is no
	// step for which every rank holds one that verifies: resuming anywhere
	// would mix steps, and starting afresh would silently drop the run.
	ErrNoCommonStep = errors.New("ckpt: no checkpoint step common to all ranks")
	// ErrMismatch means the ranks do not hold the same state (a
	// *MismatchError says where).
	ErrMismatch = errors.New("ckpt: ranks hold different state")
	// ErrRankState means a checkpoint saved WithRankRNG has no RNG state
	// for this rank (it was saved by a job of another world size).
	ErrRankState = errors.New("ckpt: checkpoint has no state for this rank")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("ckpt: manager closed")
	// ErrDamaged means checkpoint files exist but none verifies, and the
	// Manager was not told to start afresh over them
	// (WithStartFreshOverDamaged): a *DamagedError lists the files and
	// why each failed.
	ErrDamaged = errors.New("ckpt: no checkpoint verifies")
	// ErrLayout means the checkpoint to resume from was saved by a job of
	// another world size or parallel layout (a *LayoutError says which).
	// A Manager does not reshard.
	ErrLayout = errors.New("ckpt: checkpoint of another world size or parallel layout")
)

// DamagedError is Resume's error when checkpoint files exist but none
// verifies: training would otherwise start again from step 0 and lose the
// run's progress in silence. Every rank gets one; Files lists this rank's
// files (empty on a rank whose own directory held none, in a pipeline job
// whose other stages' files failed).
type DamagedError struct {
	Dir   string
	Rank  int
	Files []*checkpoint.SkipError // newest first
}

func (e *DamagedError) Error() string {
	var b strings.Builder
	if len(e.Files) == 0 {
		fmt.Fprintf(&b, "ckpt: rank %d: no checkpoint of the job verifies: another rank's files failed verification (its error lists them)", e.Rank)
	} else {
		fmt.Fprintf(&b, "ckpt: rank %d: none of the %d checkpoint(s) in %s verifies:", e.Rank, len(e.Files), e.Dir)
		for _, f := range e.Files {
			fmt.Fprintf(&b, " %s: %v;", filepath.Base(f.Path), f.Err)
		}
	}
	b.WriteString(" resuming would start again from step 0: fix or move the files, or start afresh over them explicitly (ckpt.WithStartFreshOverDamaged)")
	return b.String()
}

// Unwrap returns ErrDamaged and the reasons the files failed, so that
// errors.Is(err, checkpoint.ErrCorrupt) holds for corrupt files.
func (e *DamagedError) Unwrap() []error {
	errs := []error{ErrDamaged}
	for _, f := range e.Files {
		errs = append(errs, f)
	}
	return errs
}

// LayoutError reports a checkpoint saved by a job of another world size or
// parallel layout than the one resuming it.
type LayoutError struct {
	Path                string
	SavedWorld, World   int
	SavedLayout, Layout string
}

func (e *LayoutError) Error() string {
	if e.SavedWorld != e.World {
		return fmt.Sprintf("ckpt: %s was saved on %d ranks, resuming on %d: not supported by ckpt.Manager (it does not reshard) but for a data-parallel job with WithWorldChange: resume on %d ranks, or start afresh in another directory",
			e.Path, e.SavedWorld, e.World, e.SavedWorld)
	}
	return fmt.Sprintf("ckpt: %s was saved by a %s job, resuming as %s: not supported by ckpt.Manager: resume with the layout it was saved with, or start afresh in another directory",
		e.Path, e.SavedLayout, e.Layout)
}

// Unwrap returns ErrLayout.
func (e *LayoutError) Unwrap() error { return ErrLayout }

// Metadata keys a Manager adds to the checkpoints it writes.
const (
	// MetaWorld records the world size of the job that saved.
	MetaWorld = "ckpt.world"
	// MetaLayout records the parallel layout of the job that saved:
	// "data-parallel", or "pipeline stage <k>" (WithStage).
	MetaLayout = "ckpt.layout"
	// MetaRankRNG + "<rank>" holds that rank's RNG state (WithRankRNG).
	MetaRankRNG = "ckpt.rng."
)

// StageDir returns the directory of pipeline stage k's checkpoints under
// dir: dir/stage<k>.
func StageDir(dir string, k int) string { return filepath.Join(dir, "stage"+strconv.Itoa(k)) }

// Manager saves and resumes the checkpoints of one rank of a job. Rank 0
// writes a data-parallel job's checkpoints (every rank holds the same
// state); with WithStage each pipeline stage writes its own. Writes go
// through a checkpoint.Async, so a save stalls training only for the copy
// of the state.
//
// Every rank calls Resume, Verify, Save and (with WithInterval or
// WithRankRNG) Step at the same points: they are collectives of the group.
// A Manager's methods are not for concurrent use; Stats may be called from
// any goroutine.
type Manager struct {
	pg     *dist.ProcessGroup
	o      config
	path   string          // the directory this rank reads
	dir    *checkpoint.Dir // writers only
	writer bool
	async  *checkpoint.Async // writers only

	last   time.Time // rank 0: the last save (or New, or Resume)
	closed bool

	mu     sync.Mutex // guards gather, the time spent gathering RNG states
	gather time.Duration
}

// New returns the Manager of pg's rank for the checkpoints under dir: dir
// itself for a data-parallel job, StageDir(dir, k) with WithStage(k). The
// directory is created if needed. Close stops the writer.
func New(pg *dist.ProcessGroup, dir string, opts ...Option) (*Manager, error) {
	if pg == nil || dir == "" {
		return nil, fmt.Errorf("ckpt: %w: group %p, dir %q", ErrInvalidArgument, pg, dir)
	}
	o := defaultConfig()
	if err := options.Apply(&o, opts, "ckpt", ErrInvalidArgument); err != nil {
		return nil, err
	}
	if o.rankRNG && o.stage >= 0 {
		return nil, fmt.Errorf("ckpt: %w: WithRankRNG with WithStage (each stage saves its own RNG)", ErrInvalidArgument)
	}
	path := dir
	if o.stage >= 0 {
		path = StageDir(dir, o.stage)
	}
	var dopts []checkpoint.DirOption
	if o.keep > 0 {
		dopts = append(dopts, checkpoint.WithKeep(o.keep))
	}
	if o.logger != nil {
		dopts = append(dopts, checkpoint.WithLogger(o.logger))
	}
	m := &Manager{pg: pg, o: o, path: path, writer: o.stage >= 0 || pg.Rank() == 0, last: time.Now()}
	if m.writer {
		// Only a writer opens the Dir: OpenDir removes temporary files,
		// which on a reader could be those of a write in flight.
		d, err := checkpoint.OpenDir(path, dopts...)
		if err != nil {
			return nil, err
		}
		m.dir, m.async = d, checkpoint.NewAsync(d)
	}
	return m, nil
}

// Path returns the checkpoint directory this rank reads (and, if it
// writes, writes).
func (m *Manager) Path() string { return m.path }

// stepPath returns the path of the checkpoint of step.
func (m *Manager) stepPath(step int64) string {
	return filepath.Join(m.path, "ckpt-"+strconv.FormatInt(step, 10)+".gdc")
}

// steps lists the steps of the checkpoint files in the directory, newest
// first, as checkpoint.Dir.Steps does; a missing directory has none.
func (m *Manager) steps() ([]int64, error) {
	if m.dir != nil {
		return m.dir.Steps()
	}
	ents, err := os.ReadDir(m.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ckpt: list: %w", err)
	}
	var steps []int64
	for _, e := range ents {
		s, ok := strings.CutPrefix(e.Name(), "ckpt-")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if s, ok = strings.CutSuffix(s, ".gdc"); !ok {
			continue
		}
		step, err := strconv.ParseInt(s, 10, 64)
		if err == nil && step >= 0 && strconv.FormatInt(step, 10) == s {
			steps = append(steps, step)
		}
	}
	slices.Sort(steps)
	slices.Reverse(steps)
	return steps, nil
}

// load loads and fully verifies the checkpoint of step: through the Dir on
// a writer (which then knows the file is good when it prunes).
func (m *Manager) load(step int64) (*checkpoint.File, error) {
	if m.dir != nil {
		return m.dir.Load(step)
	}
	return checkpoint.LoadStep(m.stepPath(step), step)
}

// layout names this Manager's parallel layout, as MetaLayout records it.
func (m *Manager) layout() string {
	if m.o.stage >= 0 {
		return "pipeline stage " + strconv.Itoa(m.o.stage)
	}
	return "data-parallel"
}

// checkLayout returns a *LayoutError if f was saved by a job of another
// world size or layout. Files without the metadata (saved by other means)
// pass.
func (m *Manager) checkLayout(path string, f *checkpoint.File) error {
	e := &LayoutError{Path: path, World: m.pg.WorldSize(), Layout: m.layout()}
	if w, err := strconv.Atoi(f.Meta[MetaWorld]); err == nil && w != e.World && !m.resizes(f) {
		e.SavedWorld, e.SavedLayout = w, f.Meta[MetaLayout]
		return e
	}
	if l, ok := f.Meta[MetaLayout]; ok && l != e.Layout {
		e.SavedWorld, e.SavedLayout = e.World, l
		return e
	}
	return nil
}

// resizes reports whether f, saved by a job of another world size, may
// resume this one: WithWorldChange, and both jobs data-parallel.
func (m *Manager) resizes(f *checkpoint.File) bool {
	l, ok := f.Meta[MetaLayout]
	return m.o.worldChange && m.o.stage < 0 && (!ok || l == m.layout())
}

// setAside sets aside, on a writer, the damaged files Resume passed over.
func (m *Manager) setAside(skipped []*checkpoint.SkipError) {
	if m.dir == nil {
		return
	}
	for _, s := range skipped {
		if checkpoint.Damaged(s.Err) {
			_, _ = m.dir.SetAside(s.Step, s.Err) // logged by the Dir; a failure leaves the file, still passed over
		}
	}
}

// Writer reports whether this rank writes checkpoints.
func (m *Manager) Writer() bool { return m.writer }

func (m *Manager) log(msg string, args ...any) {
	if m.o.logger != nil {
		m.o.logger.Info("ckpt: "+msg, append([]any{"rank", m.pg.Rank()}, args...)...)
	}
}

// Due reports whether a checkpoint is due after step: every WithEvery steps
// or, with WithInterval, when rank 0's interval has passed (then Due is a
// collective, as Step).
func (m *Manager) Due(ctx context.Context, step int64) (bool, error) {
	if m.closed {
		return false, ErrClosed
	}
	due := m.o.every > 0 && step > 0 && step%m.o.every == 0
	if m.o.interval == 0 {
		return due, nil
	}
	flag := []float64{0}
	if m.pg.Rank() == 0 && (due || time.Since(m.last) >= m.o.interval) {
		flag[0] = 1
	}
	if m.pg.WorldSize() > 1 {
		if err := m.pg.Broadcast(ctx, dist.F64(flag), 0); err != nil {
			return false, fmt.Errorf("ckpt: agreeing on a save at step %d: %w", step, err)
		}
	}
	return flag[0] == 1, nil
}

// Step saves the checkpoint of step if one is due (Due) and reports whether
// it did. state is called only when a save is due and only on ranks that
// need it: the writers, and with WithRankRNG every rank (of which only
// State.RNG is used). Every rank calls Step after every optimiser step when
// WithInterval or WithRankRNG is set; otherwise only the writers need to.
func (m *Manager) Step(ctx context.Context, step int64, state func() (*checkpoint.State, error)) (bool, error) {
	due, err := m.Due(ctx, step)
	if err != nil || !due {
		return false, err
	}
	if !m.writer && !m.o.rankRNG {
		return true, nil
	}
	st, err := state()
	if err != nil {
		return false, err
	}
	return true, m.Save(ctx, step, st)
}

// Save saves st as the checkpoint of step (st.Step is ignored). On a
// writer it returns once st has been copied; the write (atomic, verified,
// pruned to the last K) runs on the writer's goroutine and a failure is
// returned by the next Save, Wait or Close as a *checkpoint.WriteError.
// With WithRankRNG every rank calls Save and sends st.RNG to rank 0 first;
// otherwise Save does nothing on a rank that does not write. Save does not
// retain or modify st.
func (m *Manager) Save(ctx context.Context, step int64, st *checkpoint.State) error {
	if m.closed {
		return ErrClosed
	}
	if st == nil || step < 0 {
		return fmt.Errorf("ckpt: %w: save step %d of state %p", ErrInvalidArgument, step, st)
	}
	cp := *st // st with the Manager's metadata
	if m.writer {
		cp.Meta = maps.Clone(st.Meta)
		if cp.Meta == nil {
			cp.Meta = map[string]string{}
		}
		cp.Meta[MetaWorld] = strconv.Itoa(m.pg.WorldSize())
		cp.Meta[MetaLayout] = m.layout()
	}
	if m.o.rankRNG && m.pg.WorldSize() > 1 {
		start := time.Now()
		if !m.writer {
			if err := m.pg.Send(ctx, 0, m.o.tag, st.RNG); err != nil {
				return fmt.Errorf("ckpt: sending the RNG state of step %d to rank 0: %w", step, err)
			}
			m.addGather(time.Since(start))
			return nil
		}
		for r := 1; r < m.pg.WorldSize(); r++ {
			b, err := m.pg.Recv(ctx, r, m.o.tag)
			if err != nil {
				return fmt.Errorf("ckpt: receiving rank %d's RNG state of step %d: %w", r, step, err)
			}
			cp.Meta[MetaRankRNG+strconv.Itoa(r)] = string(b)
		}
		m.addGather(time.Since(start))
	}
	if !m.writer {
		return nil
	}
	if err := m.async.Save(ctx, step, &cp); err != nil {
		return err
	}
	m.last = time.Now()
	m.log("saved", "step", step, "copy", m.async.Stats().LastCopy)
	return nil
}

func (m *Manager) addGather(d time.Duration) {
	m.mu.Lock()
	m.gather += d
	m.mu.Unlock()
}

// Stats are a Manager's running totals.
type Stats struct {
	checkpoint.AsyncStats               // the writer's (zero on other ranks)
	Gather                time.Duration // time spent sending or receiving RNG states (WithRankRNG)
}

// Stats returns the running totals of this rank's saves.
func (m *Manager) Stats() Stats {
	var s Stats
	if m.async != nil {
		s.AsyncStats = m.async.Stats()
	}
	m.mu.Lock()
	s.Gather = m.gather
	m.mu.Unlock()
	return s
}

// Wait waits for the write in flight, if any, and returns its error.
func (m *Manager) Wait(ctx context.Context) error {
	if m.closed {
		return ErrClosed
	}
	if m.async == nil {
		return nil
	}
	return m.async.Wait(ctx)
}

// Close waits for the write in flight and stops the writer, returning the
// write's error if it was not reported yet. Close is idempotent.
func (m *Manager) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	if m.async == nil {
		return nil
	}
	return m.async.Close()
}

// Resumed is the checkpoint a job resumes from.
type Resumed struct {
	// Step is the step every rank resumes from (the steps taken); 0 for a
	// fresh start.
	Step int64
	// Path is this rank's file ("" for a fresh start).
	Path string
	// File is the loaded, fully verified checkpoint, nil for a fresh start.
	File *checkpoint.File
	// State is File.State() with, under WithRankRNG, this rank's own RNG
	// state in RNG; nil for a fresh start.
	State *checkpoint.State
	// Newest is the newest step for which this rank found a checkpoint
	// that verifies (-1 if none): it is larger than Step when another rank
	// lacks that step.
	Newest int64
	// Skipped lists this rank's files that failed verification, newest
	// first.
	Skipped []*checkpoint.SkipError
	// SavedWorld is the world size of the job that saved the checkpoint
	// (0 when the checkpoint does not say): another than this job's only
	// WithWorldChange.
	SavedWorld int
}

// Fresh reports whether there is nothing to resume from.
func (r *Resumed) Fresh() bool { return r.File == nil }

// Resume finds the step to resume from and loads this rank's checkpoint of
// it, a collective. Every rank lists its directory (rank 0's for a
// data-parallel job, its stage's with WithStage) and the ranks agree, by
// all-reduces, on the newest step for which every rank has a checkpoint
// that verifies completely: a torn or corrupt file is passed over (listed
// in Skipped), and a step missing on any rank is passed over by all. So no
// rank resumes from another step than the others. The writers set the
// damaged files they passed over aside (checkpoint.Dir.SetAside), so that
// they never count among the checkpoints kept.
//
// If no rank has a checkpoint the result is Fresh. If files exist but none
// verifies, the error is a *DamagedError (matching ErrDamaged) listing
// them, unless WithStartFreshOverDamaged asks for a fresh start over them
// (then they are set aside). If some rank has a checkpoint that verifies
// but no step is common to all, the error matches ErrNoCommonStep. A
// checkpoint saved by a job of another world size or parallel layout is a
// *LayoutError (matching ErrLayout): a Manager does not reshard.
//
// Every rank loading a data-parallel job's files (rather than rank 0
// loading and broadcasting) needs the directory to be visible to every rank
// (one host, or a shared file system); it costs no network transfer, and
// Verify then checks that the ranks really hold the same state.
func (m *Manager) Resume(ctx context.Context) (*Resumed, error) {
	if m.closed {
		return nil, ErrClosed
	}
	steps, err := m.steps()
	if err != nil {
		return nil, err
	}
	res := &Resumed{Newest: -1}
	var f *checkpoint.File
	var fstep int64 = -1
	i := 0 // next index of steps to try
	// next loads the newest step <= limit that verifies.
	next := func(limit int64) {
		f, fstep = nil, -1
		for ; i < len(steps); i++ {
			s := steps[i]
			if s > limit {
				continue
			}
			g, err := m.load(s)
			if err != nil {
				if !errors.Is(err, os.ErrNotExist) {
					res.Skipped = append(res.Skipped, &checkpoint.SkipError{Path: m.stepPath(s), Step: s, Err: err})
					m.log("passing over a checkpoint that does not verify", "step", s, "err", err)
				}
				continue
			}
			f, fstep = g, s
			return
		}
	}
	const maxStep = 1 << 53 // steps travel as float64
	next(maxStep)
	res.Newest = fstep
	damaged := false // some rank passed over a file that does not verify
	for {
		v := []float64{float64(fstep), -float64(fstep), -float64(len(res.Skipped))}
		if err := m.pg.AllReduce(ctx, dist.F64(v), dist.Min); err != nil {
			return nil, fmt.Errorf("ckpt: agreeing on the step to resume from: %w", err)
		}
		lo, hi := int64(v[0]), int64(-v[1])
		damaged = v[2] < 0
		if lo == hi {
			break
		}
		if lo < 0 {
			if f != nil {
				if err := m.checkLayout(m.stepPath(fstep), f); err != nil {
					return nil, err
				}
			}
			return nil, fmt.Errorf("%w: rank %d's newest is step %d, some rank has none that verifies (in %s)",
				ErrNoCommonStep, m.pg.Rank(), res.Newest, m.path)
		}
		if fstep > lo {
			next(lo)
		}
	}
	if fstep < 0 { // no rank has a checkpoint that verifies
		if damaged && !m.o.freshOverDamaged {
			return nil, &DamagedError{Dir: m.path, Rank: m.pg.Rank(), Files: res.Skipped}
		}
		if damaged {
			m.log("starting afresh over checkpoints that do not verify (WithStartFreshOverDamaged)", "files", len(res.Skipped))
		}
		m.setAside(res.Skipped)
		return res, nil
	}
	res.Step, res.Path, res.File, res.State = fstep, m.stepPath(fstep), f, f.State()
	if err := m.checkLayout(res.Path, f); err != nil {
		return nil, err
	}
	m.setAside(res.Skipped)
	if res.Step != res.Newest {
		m.log("resuming from an older step than this rank's newest, the newest every rank has", "step", res.Step, "newest", res.Newest)
	}
	if w, err := strconv.Atoi(res.State.Meta[MetaWorld]); err == nil {
		res.SavedWorld = w
	}
	if res.SavedWorld != 0 && res.SavedWorld != m.pg.WorldSize() {
		m.log("resuming a checkpoint of another world size (WithWorldChange)", "step", res.Step,
			"saved_world", res.SavedWorld, "world", m.pg.WorldSize())
		if m.o.rankRNG {
			res.State.RNG = nil // the ranks' streams were another world's
		}
	} else if m.o.rankRNG && m.pg.Rank() != 0 {
		rng, ok := res.State.Meta[MetaRankRNG+strconv.Itoa(m.pg.Rank())]
		if !ok {
			return nil, fmt.Errorf("%w: rank %d's RNG state is not in %s (saved by a world of %s)",
				ErrRankState, m.pg.Rank(), res.Path, res.State.Meta[MetaWorld])
		}
		res.State.RNG = []byte(rng)
	}
	m.last = time.Now()
	return res, nil
}
