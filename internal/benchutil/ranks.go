package benchutil

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/gdist/gdist/internal/launch"
)

// ResultPrefix starts the line that carries a rank's result (JSON) on its
// stdout; see Report and RunRanks.
const ResultPrefix = "GDIST_BENCH_RESULT "

// Report prints v as a rank's result line.
func Report(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s%s\n", ResultPrefix, b)
	return err
}

// RunRanks starts the ranks of job (by default re-executing the running
// program: see launch.Job) and returns every rank's result: the JSON its
// Report printed, decoded into a T. RunRanks sets job.Output: the ranks'
// stderr goes to stderr, prefixed by rank; a rank that fails, or prints no
// result, fails the run. A zero job.KillGrace becomes 5 s.
func RunRanks[T any](ctx context.Context, job launch.Job, stderr io.Writer) ([]T, error) {
	world := job.NProc
	outs := make([]bytes.Buffer, world)
	prefixed := launch.Prefixed(nil, stderr)
	job.Output = func(r int) (io.Writer, io.Writer) {
		_, e := prefixed(r)
		return &outs[r], e
	}
	if job.KillGrace == 0 {
		job.KillGrace = 5 * time.Second
	}
	l, err := launch.Start(ctx, job)
	if err != nil {
		return nil, err
	}
	if err := l.Wait(); err != nil {
		return nil, err
	}
	res := make([]T, world)
	for r := range world {
		found := false
		sc := bufio.NewScanner(&outs[r])
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), ResultPrefix); ok {
				if err := json.Unmarshal([]byte(line), &res[r]); err != nil {
					return nil, fmt.Errorf("rank %d: result: %w", r, err)
				}
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("rank %d printed no result", r)
		}
	}
	return res, nil
}

// LoadAvg returns the 1-, 5- and 15-minute load averages (Linux's
// /proc/loadavg), or "n/a".
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "n/a"
}
