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

	"github.com/gdist/gdist/internal/options"
)

// DefaultKeep is how many checkpoints a Dir keeps unless WithKeep says
// otherwise.
const DefaultKeep = 3

// Dir is a directory of checkpoints named ckpt-<step>.gdc, one per saved
// step. SaveStep writes a new one atomically, verifies it by reading it
// back and only then removes the oldest beyond the last K; LoadLatest
// returns the newest one that verifies, passing over torn or corrupt files.
//
// One process writes a Dir at a time; any number may read it. The methods
// of a Dir may be called from several goroutines.
type Dir struct {
	path   string
	keep   int
	logger *slog.Logger
}

// DirOption configures OpenDir. Options are validated by OpenDir.
type DirOption func(*dirOptions) error

type dirOptions struct {
	keep   int
	logger *slog.Logger
}

// WithKeep makes SaveStep keep the k newest checkpoints (k >= 1; default
// DefaultKeep). Files that fail verification count towards k like the
// others, but a new checkpoint is only ever saved after it verified, so at
// least one good checkpoint remains.
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
	d := &Dir{path: path, keep: o.keep, logger: o.logger}
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
// ckpt-<step>.gdc and removes the oldest checkpoints beyond the newest K. So
// on error every earlier checkpoint is untouched, and a name only ever
// refers to a file that verified. step must not be negative.
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
		if _, err := d.verify(tmp, step); err != nil {
			return fmt.Errorf("checkpoint: step %d did not verify after writing: %w", step, err)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return path, d.prune()
}

// prune removes the checkpoints beyond the newest d.keep.
func (d *Dir) prune() error {
	steps, err := d.Steps()
	if err != nil {
		return err
	}
	var errs []error
	removed := false
	for _, step := range steps[min(d.keep, len(steps)):] {
		if err := os.Remove(d.StepPath(step)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("checkpoint: prune: %w", err))
			continue
		}
		removed = true
		d.log("removed old checkpoint", "step", step)
	}
	if removed {
		syncDir(d.path)
	}
	return errors.Join(errs...)
}

// verify loads the whole checkpoint at path and checks that it records step.
func (d *Dir) verify(path string, step int64) (*File, error) {
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
// corrupt files it matches ErrCorrupt too). LoadLatest never removes a file.
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
		f, err := d.verify(path, step)
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
