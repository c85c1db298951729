package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ckpt"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/mnist"
	"github.com/gdist/gdist/models/mlp"
	"github.com/gdist/gdist/models/transformer"
	"github.com/gdist/gdist/train/checkpoint"
	mdata "github.com/gdist/gdist/train/data"
	"github.com/gdist/gdist/train/optim"
)

var errUsage = errors.New("bench/checkpoint: usage")

func main() { cli.Main("bench/checkpoint", errUsage, run) }

// model is one training loop to measure: a step, the live state to save
// and how to restore a checkpoint into the model.
type model struct {
	name    string
	params  int
	step    func() error
	state   func(step int64) (*checkpoint.State, error)
	restore func(r *ckpt.Resumed) error
	close   func()
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("checkpoint", flag.ContinueOnError)
	fs.SetOutput(stderr)
	which := fs.String("model", "both", "mlp, transformer or both")
	every := fs.Int64("every", 100, "steps between checkpoints")
	rounds := fs.Int("rounds", 3, "rounds of (every steps without a save, every steps with one), order alternating")
	loads := fs.Int("loads", 5, "times to measure resuming")
	dirFlag := fs.String("dir", "", "checkpoint directory (default: a temporary one, removed at the end)")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return err
	}
	if *every < 1 || *rounds < 1 || *loads < 1 {
		return cli.Usagef(fs, errUsage, "-every, -rounds and -loads must be >= 1")
	}
	var names []string
	switch *which {
	case "both":
		names = []string{"mlp", "transformer"}
	case "mlp", "transformer":
		names = []string{*which}
	default:
		return cli.Usagef(fs, errUsage, "-model %q: want mlp, transformer or both", *which)
	}
	dir := *dirFlag
	if dir == "" {
		d, err := os.MkdirTemp("", "bench-checkpoint")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	trs, err := transport.NewLocal(1)
	if err != nil {
		return err
	}
	pg, err := dist.New(trs[0])
	if err != nil {
		return err
	}
	defer cli.Close(&err, pg)
	fmt.Fprintf(stdout, "bench/checkpoint: GOMAXPROCS %d, %d CPUs; a save every %d steps; %d rounds; checkpoints in %s\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), *every, *rounds, dir)
	for _, name := range names {
		var m *model
		if name == "mlp" {
			m, err = newMLP()
		} else {
			m, err = newTransformer()
		}
		if err != nil {
			return err
		}
		err = measure(ctx, stdout, pg, m, filepath.Join(dir, name), *every, *rounds, *loads)
		m.close()
		if err != nil {
			return err
		}
	}
	return nil
}

// measure runs the rounds and the loads for m and prints the results.
func measure(ctx context.Context, w io.Writer, pg *dist.ProcessGroup, m *model, dir string, every int64, rounds, loads int) error {
	mgr, err := ckpt.New(pg, dir, ckpt.WithEvery(every))
	if err != nil {
		return err
	}
	defer mgr.Close()
	for range 10 { // warm up
		if err := m.step(); err != nil {
			return err
		}
	}
	var step int64
	var cpuPlain, cpuSaving []time.Duration
	block := func(save bool) (time.Duration, error) {
		c0 := cpuTime()
		defer func() {
			c := cpuTime() - c0
			if save {
				cpuSaving = append(cpuSaving, c)
			} else {
				cpuPlain = append(cpuPlain, c)
			}
		}()
		start := time.Now()
		for i := range every {
			if err := m.step(); err != nil {
				return 0, err
			}
			step++
			if save && i == 0 { // the save's write then runs during this block
				if err := mgr.Save(ctx, step, mustState(m, step)); err != nil {
					return 0, err
				}
			}
		}
		took := time.Since(start)
		return took, mgr.Wait(ctx) // outside the wall time (normally long done), inside the CPU time
	}
	var plain, saving []time.Duration
	var over []float64
	for r := range rounds {
		var a, b time.Duration
		var err error
		if r%2 == 0 {
			if a, err = block(false); err == nil {
				b, err = block(true)
			}
		} else {
			if b, err = block(true); err == nil {
				a, err = block(false)
			}
		}
		if err != nil {
			return err
		}
		plain, saving = append(plain, a), append(saving, b)
		over = append(over, float64(b-a)/float64(a))
	}
	st := mgr.Stats()
	stepTime := median(plain) / time.Duration(every)
	copyMean := st.Copy / time.Duration(st.Saves)
	writeMean := st.Write / time.Duration(st.Writes)
	fi, err := os.Stat(st.LastPath)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%s: %d parameters; checkpoint %.2f MB; step %.2f ms (median block of %d steps / %d)\n",
		m.name, m.params, float64(fi.Size())/1e6, ms(stepTime), every, every)
	fmt.Fprintf(w, "%s: save stalls training %.3f ms (the copy; mean of %d) = %.4f%% of %d steps; the write on its goroutine takes %.1f ms\n",
		m.name, ms(copyMean), st.Saves, 100*float64(copyMean)/float64(stepTime*time.Duration(every)), every, ms(writeMean))
	fmt.Fprintf(w, "%s: end to end, %d steps with a save vs without: %+.2f%% median of %d rounds (each: %v), min-to-min %+.2f%%\n",
		m.name, every, 100*medianF(over), rounds, fmtPct(over), 100*(float64(slices.Min(saving))-float64(slices.Min(plain)))/float64(slices.Min(plain)))
	if cpuPlain[0] > 0 {
		fmt.Fprintf(w, "%s: process CPU time, %d steps with a save vs without: %+.2f%% median (each: %v): the save's whole CPU cost (copy, encode, CRC, write, read back and verify), what it takes from training when the CPUs are saturated\n",
			m.name, every, 100*medianF(ratios(cpuSaving, cpuPlain)), fmtPct(ratios(cpuSaving, cpuPlain)))
	}
	// The whole save, synchronously on this goroutine (no training
	// running): its CPU time bounds what the write goroutine can take from
	// training.
	sd, err := checkpoint.OpenDir(dir + "-sync")
	if err != nil {
		return err
	}
	var syncCPU, syncWall []time.Duration
	for i := range 5 {
		c0, t0 := cpuTime(), time.Now()
		if _, err := sd.SaveStep(int64(i), mustState(m, int64(i))); err != nil {
			return err
		}
		syncWall, syncCPU = append(syncWall, time.Since(t0)), append(syncCPU, cpuTime()-c0)
	}
	os.RemoveAll(sd.Path())
	if cpuPlain[0] > 0 {
		stepCPU := median(cpuPlain) / time.Duration(every)
		fmt.Fprintf(w, "%s: a whole save done synchronously (copy, encode, CRC, write, fsync, read back, verify): %.1f ms wall, %.1f ms CPU (medians of 5) = %.2f%% of the CPU time of %d steps (%.2f ms CPU per step)\n",
			m.name, ms(median(syncWall)), ms(median(syncCPU)), 100*float64(median(syncCPU))/float64(stepCPU*time.Duration(every)), every, ms(stepCPU))
	}
	if err := mgr.Close(); err != nil {
		return err
	}

	var resume, restore time.Duration
	for range loads {
		lm, err := ckpt.New(pg, dir)
		if err != nil {
			return err
		}
		t0 := time.Now()
		r, err := lm.Resume(ctx)
		if err != nil {
			return err
		}
		t1 := time.Now()
		if err := m.restore(r); err != nil {
			return err
		}
		if err := lm.Verify(ctx, mustState(m, r.Step)); err != nil {
			return err
		}
		restore += time.Since(t1)
		resume += t1.Sub(t0)
		lm.Close()
	}
	fmt.Fprintf(w, "%s: resume: %.1f ms to find, read and verify the newest checkpoint, %.1f ms to restore it into the model and solver and verify (mean of %d)\n",
		m.name, ms(resume/time.Duration(loads)), ms(restore/time.Duration(loads)), loads)
	return nil
}

func ratios(b, a []time.Duration) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = float64(b[i]-a[i]) / float64(a[i])
	}
	return out
}

func mustState(m *model, step int64) *checkpoint.State {
	st, err := m.state(step)
	if err != nil {
		panic(err)
	}
	return st
}

func ms(d time.Duration) float64 { return d.Seconds() * 1e3 }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func medianF(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

func fmtPct(xs []float64) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += " "
		}
		out += fmt.Sprintf("%+.2f%%", 100*x)
	}
	return "[" + out + "]"
}

// nodesState is the live state of params and adam, plus opaque sampler and
// RNG bytes.
func nodesState(cfg any, params gorgonia.Nodes, adam *optim.Adam, step int64, sampler, rng []byte) *checkpoint.State {
	st := &checkpoint.State{Config: cfg, Optimizer: adam.State().Checkpoint(), Step: step, Sampler: sampler, RNG: rng}
	for _, p := range params {
		st.Params = append(st.Params, checkpoint.Named{Name: p.Name(), Tensor: p.Value().(tensor.Tensor)})
	}
	return st
}

// restoreNodes copies the checkpoint's tensors into params and its solver
// state into adam.
func restoreNodes(r *ckpt.Resumed, params gorgonia.Nodes, adam *optim.Adam) error {
	for _, p := range params {
		src, err := r.File.Tensor(p.Name())
		if err != nil {
			return err
		}
		copy(p.Value().Data().([]float32), src.Data().([]float32))
	}
	st, err := optim.FromCheckpoint(r.State.Optimizer)
	if err != nil {
		return err
	}
	return adam.SetState(st)
}

// newMLP is examples/mnist's model and loop in a world of one: the
// 784-256-128-10 MLP, batch 64, Adam, MNIST batches from a sampler.
func newMLP() (*model, error) {
	dir, err := mnist.Locate("")
	if err != nil {
		return nil, err
	}
	set, _, err := mnist.Load(dir)
	if err != nil {
		return nil, err
	}
	const batch = 64
	sizes := []int{784, 256, 128, mnist.Classes}
	g := gorgonia.NewGraph()
	mm, err := mlp.New(g, mlp.Config{Sizes: sizes, Batch: batch, Seed: 1})
	if err != nil {
		return nil, err
	}
	x, y := mm.NewInputs()
	xs, ys := make([]float32, batch*sizes[0]), make([]float32, batch*mnist.Classes)
	if err := gorgonia.Let(x, tensor.New(tensor.WithShape(x.Shape()...), tensor.WithBacking(xs))); err != nil {
		return nil, err
	}
	if err := gorgonia.Let(y, tensor.New(tensor.WithShape(y.Shape()...), tensor.WithBacking(ys))); err != nil {
		return nil, err
	}
	logits, err := mm.Forward(x)
	if err != nil {
		return nil, err
	}
	loss, err := mlp.Loss(logits, y)
	if err != nil {
		return nil, err
	}
	params := mm.Learnables()
	if _, err := gorgonia.Grad(loss, params...); err != nil {
		return nil, err
	}
	vm := gorgonia.NewTapeMachine(g, gorgonia.BindDualValues(params...))
	adam, err := optim.NewAdam(optim.WithLearnRate(1e-3))
	if err != nil {
		return nil, err
	}
	sampler, err := mdata.New(set.N, 0, 1, mdata.WithSeed(1), mdata.WithDropLast(true))
	if err != nil {
		return nil, err
	}
	n := 0
	for _, p := range params {
		n += p.Shape().TotalSize()
	}
	return &model{
		name: "mnist MLP", params: n,
		step: func() error {
			if sampler.Remaining() < batch {
				sampler.SetEpoch(sampler.Epoch() + 1)
			}
			if err := mnist.Batch(set, sampler.Next(batch), xs, ys); err != nil {
				return err
			}
			defer vm.Reset()
			if err := vm.RunAll(); err != nil {
				return err
			}
			return adam.Step(gorgonia.NodesToValueGrads(params))
		},
		state: func(step int64) (*checkpoint.State, error) {
			pos, err := sampler.MarshalBinary()
			if err != nil {
				return nil, err
			}
			return nodesState(sizes, params, adam, step, pos, nil), nil
		},
		restore: func(r *ckpt.Resumed) error {
			if err := restoreNodes(r, params, adam); err != nil {
				return err
			}
			return sampler.UnmarshalBinary(r.State.Sampler)
		},
		close: func() { vm.Close() },
	}, nil
}

// newTransformer is examples/transformer train's default model and loop in
// a world of one: transformer.DefaultConfig on Newton's Opticks, batch 16,
// Adam with clipping at 1.
func newTransformer() (*model, error) {
	path := filepath.Join(runtime.GOROOT(), "src", "testdata", "Isaac.Newton-Opticks.txt")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	text := string(b)
	vocab := transformer.NewVocab(text)
	ids, err := vocab.Encode(text)
	if err != nil {
		return nil, err
	}
	cfg := transformer.DefaultConfig(vocab.Size())
	cfg.Seed = 1
	const batch = 16
	adam, err := optim.NewAdam(optim.WithLearnRate(3e-3), optim.WithClip(1))
	if err != nil {
		return nil, err
	}
	tr, err := transformer.NewTrainer(cfg, batch, transformer.WithSolver(adam))
	if err != nil {
		return nil, err
	}
	pcg := rand.NewPCG(1, 0)
	rng := rand.New(pcg)
	params := tr.Stage.Learnables()
	return &model{
		name: "transformer", params: cfg.NumParams(),
		step: func() error {
			in, tgt, err := transformer.SampleBatch(rng, ids, batch, cfg.Ctx)
			if err != nil {
				return err
			}
			_, err = tr.Step(context.Background(), in, tgt)
			return err
		},
		state: func(step int64) (*checkpoint.State, error) {
			r, err := pcg.MarshalBinary()
			if err != nil {
				return nil, err
			}
			return nodesState(cfg, params, adam, step, nil, r), nil
		},
		restore: func(r *ckpt.Resumed) error {
			if err := restoreNodes(r, params, adam); err != nil {
				return err
			}
			return pcg.UnmarshalBinary(r.State.RNG)
		},
		close: func() { tr.Close() },
	}, nil
}
