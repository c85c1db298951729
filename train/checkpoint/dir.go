package checkpoint

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gdist/gdist/internal/options"
)

// DefaultKeep is how many checkpoints a Dir keeps unless WithKeep says
// otherwise.
const DefaultKeep = 3

// Dir is a directory of checkpoints named ckpt-<step>.gdc, one per saved
// step. SaveStep writes a new one atomically, verifies it by reading it
// back and only then prunes: it keeps the newest K checkpoints that verify
// and removes older ones. LoadLatest returns the newest one that verifies,
// passing over torn or corrupt files.
//
// A file that fails verification is never counted among the K: pruning
// sets it aside (SetAside renames it ckpt-<step>.gdc.corrupt, where nothing
// takes it for a checkpoint again) and logs why. Files of a step above the
// one being saved are not the saving run's own: they are not counted either,
// and are left in place if they verify. So damaged or foreign files never
// push a run's good checkpoints out, and the checkpoint just saved is never
// removed by its own save.
//
// One process writes a Dir at a time; any number may read it. The methods
// of a Dir may be called from several goroutines.
type Dir struct {
	path   string
	keep   int
	logger *slog.Logger

	mu   sync.Mutex
	good map[int64]fileID // steps whose file this Dir verified, and that file
}

// fileID tells a file apart from another one later written under its name.
type fileID struct {
	size int64
	mod  time.Time
}

// DirOption configures OpenDir. Options are validated by OpenDir.
type DirOption func(*dirOptions) error

type dirOptions struct {
	keep   int
	logger *slog.Logger
}

// WithKeep makes SaveStep keep the k newest checkpoints that verify (k >= 1;
// default DefaultKeep). Files that fail verification do not count towards
// k: pruning sets them aside (see Dir).
func WithKeep(k int) DirOption {
	return func(o *dirOptions) error {
		if k < 1 {
			return fmt.Errorf("checkpoint: %w: keep %d checkpoints (want >= 1)", ErrInvalidArgument, k)
		}
		o.keep = k
		return nil
	}
}

// WithLogger makes the Dir log the checkpoints it passes over and the ones
// it removes (default: no logging; the reasons are returned either way).
func WithLogger(l *slog.Logger) DirOption {
	return func(o *dirOptions) error {
		if l == nil {
			return fmt.Errorf("checkpoint: %w: nil logger", ErrInvalidArgument)
		}
		o.logger = l
		return nil
	}
}

// OpenDir returns the checkpoint directory at path, creating it if needed,
// and removes the temporary files an interrupted save left in it.
func OpenDir(path string, opts ...DirOption) (*Dir, error) {
	o := dirOptions{keep: DefaultKeep}
	if err := options.Apply(&o, opts, "checkpoint", ErrInvalidArgument); err != nil {
		return nil, err
	}
	d := &Dir{path: path, keep: o.keep, logger: o.logger, good: map[int64]fileID{}}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return nil, fmt.Errorf("checkpoint: open dir: %w", err)
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: open dir: %w", err)
	}
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, ".ckpt-") && strings.Contains(n, ".gdc"+tmpMarker) {
			if err := os.Remove(filepath.Join(path, n)); err == nil {
				d.log("removed temporary file of an interrupted save", "file", n)
			}
		}
	}
	return d, nil
}

func (d *Dir) log(msg string, args ...any) {
	if d.logger != nil {
		d.logger.Info("checkpoint: "+msg, append([]any{"dir", d.path}, args...)...)
	}
}

// Path returns the directory's path.
func (d *Dir) Path() string { return d.path }

// StepPath returns the path of the checkpoint of step.
func (d *Dir) StepPath(step int64) string {
	return filepath.Join(d.path, "ckpt-"+strconv.FormatInt(step, 10)+".gdc")
}

// parseStep returns the step of a checkpoint file name.
func parseStep(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, "ckpt-")
	if !ok {
		return 0, false
	}
	if s, ok = strings.CutSuffix(s, ".gdc"); !ok || s == "" || s[0] == '+' || s[0] == '-' {
		return 0, false
	}
	step, err := strconv.ParseInt(s, 10, 64)
	if err != nil || strconv.FormatInt(step, 10) != s {
		return 0, false
	}
	return step, true
}

// Steps returns the steps of the checkpoint files in the directory, newest
// (largest) first, whether or not they verify. The caller owns the slice.
func (d *Dir) Steps() ([]int64, error) {
	ents, err := os.ReadDir(d.path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list: %w", err)
	}
	var steps []int64
	for _, e := range ents {
		if step, ok := parseStep(e.Name()); ok && e.Type().IsRegular() {
			steps = append(steps, step)
		}
	}
	slices.Sort(steps)
	slices.Reverse(steps)
	return steps, nil
}

// SaveStep writes s as the checkpoint of step (s.Step is ignored: the file
// records step) and returns its path. It writes a temporary file, syncs it,
// reads it back and verifies it completely, and only then renames it to
// ckpt-<step>.gdc and prunes (see Dir): of the checkpoints up to step it
// keeps the newest K that verify, step's among them, and removes the older
// ones. So on error every earlier checkpoint is untouched, and a name only
// ever refers to a file that verified. step must not be negative.
func (d *Dir) SaveStep(step int64, s *State) (string, error) {
	if step < 0 {
		return "", fmt.Errorf("checkpoint: %w: negative step %d", ErrInvalidArgument, step)
	}
	if s == nil {
		return "", fmt.Errorf("checkpoint: %w: nil state", ErrInvalidArgument)
	}
	st := *s
	st.Step = step
	path := d.StepPath(step)
	err := saveAtomic(path, &st, func(tmp string) error {
		if _, err := LoadStep(tmp, step); err != nil {
			return fmt.Errorf("checkpoint: step %d did not verify after writing: %w", step, err)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	d.remember(step)
	return path, d.prune(step)
}

// prune keeps, of the checkpoints up to saved (the step just saved), the
// newest d.keep that verify, and removes the older ones. A file that fails
// verification is set aside and not counted; one above saved is not
// counted either (it is not this run's), and is set aside if damaged, left
// alone otherwise.
func (d *Dir) prune(saved int64) error {
	steps, err := d.Steps()
	if err != nil {
		return err
	}
	var errs []error
	removed := false
	kept := 0
	for _, step := range steps {
		switch {
		case step == saved:
			kept++
			continue
		case step < saved && kept >= d.keep:
			if err := os.Remove(d.StepPath(step)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("checkpoint: prune: %w", err))
				continue
			}
			removed = true
			d.forget(step)
			d.log("removed old checkpoint", "step", step)
			continue
		}
		err := d.check(step)
		switch {
		case err == nil && step < saved:
			kept++
		case err == nil:
			d.log("leaving a checkpoint of a later step than the one saved: it is not this run's, and not counted among the kept",
				"step", step, "saved", saved)
		case Damaged(err):
			if _, serr := d.SetAside(step, err); serr != nil {
				errs = append(errs, serr)
			}
		case !errors.Is(err, os.ErrNotExist):
			d.log("leaving a checkpoint that cannot be verified here, not counted among the kept", "step", step, "err", err)
		}
	}
	if removed {
		syncDir(d.path)
	}
	return errors.Join(errs...)
}

// Damaged reports whether err, from loading a checkpoint, says the file is
// damaged (truncated, corrupt, or not a checkpoint at all) rather than
// unreadable or of a format version this build does not read.
func Damaged(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrBadMagic)
}

// SetAside renames the checkpoint of step, which failed verification with
// why, to ckpt-<step>.gdc.corrupt (or .corrupt-2, -3, ... if that name is
// taken), where no Dir or reader takes it for a checkpoint again, logs it,
// and returns the new path. Pruning does this to the damaged files it
// finds; a caller that passed over damaged files (LoadLatest's
// Found.Skipped) may do it too.
func (d *Dir) SetAside(step int64, why error) (string, error) {
	path := d.StepPath(step)
	dst := path + ".corrupt"
	for i := 2; ; i++ {
		if _, err := os.Lstat(dst); errors.Is(err, os.ErrNotExist) {
			break
		}
		dst = path + ".corrupt-" + strconv.Itoa(i)
	}
	if err := os.Rename(path, dst); err != nil {
		return "", fmt.Errorf("checkpoint: setting aside step %d: %w", step, err)
	}
	d.forget(step)
	syncDir(d.path)
	if d.logger != nil {
		d.logger.Warn("checkpoint: set aside a checkpoint that does not verify", "dir", d.path, "step", step,
			"file", filepath.Base(dst), "err", why)
	}
	return dst, nil
}

// Load loads and fully verifies the checkpoint of step (as LoadLatest
// does each file it tries). The Dir remembers a file that verified, so
// pruning need not read it again.
func (d *Dir) Load(step int64) (*File, error) {
	f, err := LoadStep(d.StepPath(step), step)
	if err == nil {
		d.remember(step)
	}
	return f, err
}

// check verifies the checkpoint of step unless this Dir verified that very
// file already.
func (d *Dir) check(step int64) error {
	id, ok := statID(d.StepPath(step))
	d.mu.Lock()
	known, seen := d.good[step]
	d.mu.Unlock()
	if ok && seen && known == id {
		return nil
	}
	_, err := d.Load(step)
	return err
}

// remember records that the file of step verified.
func (d *Dir) remember(step int64) {
	id, ok := statID(d.StepPath(step))
	d.mu.Lock()
	defer d.mu.Unlock()
	if ok {
		d.good[step] = id
	} else {
		delete(d.good, step)
	}
}

func (d *Dir) forget(step int64) {
	d.mu.Lock()
	delete(d.good, step)
	d.mu.Unlock()
}

func statID(path string) (fileID, bool) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, false
	}
	return fileID{size: fi.Size(), mod: fi.ModTime()}, true
}

// LoadStep loads and fully verifies the checkpoint at path (Load) and
// checks that it records step, as a file named for step must.
func LoadStep(path string, step int64) (*File, error) {
	f, err := Load(path)
	if err != nil {
		return nil, err
	}
	if f.Version >= 2 && f.Step != step {
		return nil, fmt.Errorf("%s: %w", path, corrupt("file records step %d, its name step %d", f.Step, step))
	}
	return f, nil
}

// SkipError reports a checkpoint that LoadLatest passed over.
type SkipError struct {
	Path string
	Step int64
	Err  error
}

func (e *SkipError) Error() string {
	return fmt.Sprintf("checkpoint: skipped step %d (%s): %v", e.Step, e.Path, e.Err)
}

func (e *SkipError) Unwrap() error { return e.Err }

// Found describes the checkpoint Latest or LoadLatest chose.
type Found struct {
	// Path and Step name the checkpoint chosen.
	Path string
	Step int64
	// Skipped lists the newer checkpoints that failed verification, newest
	// first, each with its reason.
	Skipped []*SkipError
}

// LoadLatest loads and fully verifies the newest checkpoint in the
// directory, falling back to older ones past any that fail (truncated,
// corrupt, unreadable); each one passed over is logged and listed in
// Found.Skipped. With no checkpoint that verifies, the error matches
// ErrNoCheckpoint, and also wraps the reasons of those that failed (so with
// corrupt files it matches ErrCorrupt too). LoadLatest never removes or
// renames a file: a writer sets damaged ones aside (SetAside, or pruning).
func (d *Dir) LoadLatest() (*File, Found, error) {
	for {
		f, found, vanished, err := d.loadLatest()
		if vanished && err != nil && len(found.Skipped) == 0 {
			continue // a concurrent SaveStep pruned what was listed: list again
		}
		return f, found, err
	}
}

func (d *Dir) loadLatest() (f *File, found Found, vanished bool, err error) {
	steps, err := d.Steps()
	if err != nil {
		return nil, Found{}, false, err
	}
	for _, step := range steps {
		path := d.StepPath(step)
		f, err := d.Load(step)
		if err == nil {
			found.Path, found.Step = path, step
			return f, found, vanished, nil
		}
		if errors.Is(err, os.ErrNotExist) {
			vanished = true // removed since it was listed
			continue
		}
		skip := &SkipError{Path: path, Step: step, Err: err}
		d.log("passing over a checkpoint that does not verify", "step", step, "err", err)
		found.Skipped = append(found.Skipped, skip)
	}
	if len(found.Skipped) == 0 {
		return nil, found, vanished, fmt.Errorf("%w in %s", ErrNoCheckpoint, d.path)
	}
	errs := make([]error, len(found.Skipped))
	for i, s := range found.Skipped {
		errs[i] = s
	}
	return nil, found, vanished, fmt.Errorf("%w in %s: %d checkpoints failed verification: %w",
		ErrNoCheckpoint, d.path, len(errs), errors.Join(errs...))
}

// Latest is LoadLatest without keeping the decoded file: it returns which
// checkpoint verifies, for a caller that then loads part of it with
// LoadSubset (a pipeline stage loading its own layers).
func (d *Dir) Latest() (Found, error) {
	_, found, err := d.LoadLatest()
	return found, err
}
