package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport/transporttest"
)

var testSizes = []int{5, 7, 6, 8, 3}

// mlpBuilder builds stage `stage` of p of an MLP for micro-batches of rows
// rows.
func mlpBuilder(sizes []int, p, stage, rows int, dt tensor.Dtype) Builder {
	return mlpModel(sizes, dt).stageBuilder(p, stage, rows)
}

// trainResult is what one rank of a training run reports.
type trainResult struct {
	refResult
	stats Stats
}

// runTraining trains tm on p in-process stages for `steps` SGD steps with
// m micro-batches of a batch of `batch` samples, and returns each stage's
// result of the last step.
func runTraining(t *testing.T, tm testModel, p, m, batch, steps int, lr float64, opts ...Option) []trainResult {
	t.Helper()
	res := make([]trainResult, p)
	errs := runRanks(t, p, func(pg *dist.ProcessGroup) error {
		r, st, err := trainStages(context.Background(), pg, tm, m, batch/m, steps, lr, opts...)
		res[pg.Rank()] = trainResult{r, st}
		return err
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	return res
}

type variant struct {
	name string
	opts []Option
}

var variants = []variant{
	{"gpipe", nil},
	{"gpipe-recompute", []Option{WithRecompute(true)}},
	{"1f1b", []Option{WithSchedule(OneFOneB)}},
	{"1f1b-recompute", []Option{WithSchedule(OneFOneB), WithRecompute(true)}},
	{"zb-h1", []Option{WithSchedule(ZeroBubble)}},
	{"zb-h1-recompute", []Option{WithSchedule(ZeroBubble), WithRecompute(true)}},
}

// checkTraining trains tm in every variant for each (p, m) and compares
// with one process on the whole batch.
func checkTraining(t *testing.T, tm testModel, batch int, ps, ms []int) {
	const steps, lr = 2, 0.1
	ref, err := reference(tm, batch, steps, lr)
	require.NoError(t, err)
	for _, p := range ps {
		for _, m := range ms {
			var first [][]float64 // the first variant's gradients, to compare the others bitwise
			for _, v := range variants {
				t.Run(fmt.Sprintf("p%d/m%d/%s", p, m, v.name), func(t *testing.T) {
					res := runTraining(t, tm, p, m, batch, steps, lr, v.opts...)
					var grads [][]float64
					for _, r := range res {
						grads = append(grads, r.grads...)
					}
					last := res[p-1]
					worst, err := compareTraining(grads, last.refResult, ref, 1e-12)
					require.NoError(t, err)
					t.Logf("max |grad - single process| = %.3g", worst)
					assert.LessOrEqual(t, maxAbsDiff(t, last.out, ref.out), 1e-12)
					if first == nil {
						first = grads
					} else {
						assert.Equal(t, first, grads, "schedules must give bitwise equal gradients")
					}
				})
			}
		}
	}
}

func TestTrainMatchesSingleProcess(t *testing.T) {
	checkTraining(t, mlpModel(testSizes, tensor.Float64), 8, []int{1, 2, 3, 4}, []int{1, 2, 4, 8})
}

// TestInterleavedMatchesSingleProcess: p ranks of v chunks each
// (NewInterleaved) train to the gradients of one process, and to bitwise
// the gradients of p*v stages of one chunk each.
func TestInterleavedMatchesSingleProcess(t *testing.T) {
	tm := mlpModel(testSizes, tensor.Float64) // 4 layers
	const batch, steps, lr = 8, 2, 0.1
	ref, err := reference(tm, batch, steps, lr)
	require.NoError(t, err)
	for _, c := range []struct{ p, v int }{{1, 2}, {2, 2}, {1, 4}} {
		for _, m := range []int{2, 4, 8} {
			if m%c.p != 0 {
				continue
			}
			for _, rc := range []bool{false, true} {
				t.Run(fmt.Sprintf("p%d/v%d/m%d/recompute=%v", c.p, c.v, m, rc), func(t *testing.T) {
					byStage := make([][][]float64, c.p*c.v) // gradients of each virtual stage
					var last refResult
					errs := runRanks(t, c.p, func(pg *dist.ProcessGroup) error {
						r, grads, err := trainInterleaved(context.Background(), pg, tm, c.v, m, batch/m, steps, lr, WithRecompute(rc))
						for k, g := range grads {
							byStage[k*c.p+pg.Rank()] = g
						}
						if pg.Rank() == c.p-1 {
							last = r
						}
						return err
					})
					for r, err := range errs {
						require.NoError(t, err, "rank %d", r)
					}
					var grads [][]float64
					for _, g := range byStage {
						grads = append(grads, g...)
					}
					worst, err := compareTraining(grads, last, ref, 1e-12)
					require.NoError(t, err)
					t.Logf("max |grad - single process| = %.3g", worst)
					assert.LessOrEqual(t, maxAbsDiff(t, last.out, ref.out), 1e-12)
					flat := runTraining(t, tm, c.p*c.v, m, batch, steps, lr)
					var want [][]float64
					for _, r := range flat {
						want = append(want, r.grads...)
					}
					assert.Equal(t, want, grads, "interleaved gradients must equal p*v stages' bitwise")
				})
			}
		}
	}
}

// checkInfer runs Infer on p stages with m micro-batches of n samples and
// compares with one process.
func checkInfer(t *testing.T, tm testModel, batch int, ps, ms []int) {
	for _, p := range ps {
		for _, m := range ms {
			t.Run(fmt.Sprintf("p%d/m%d", p, m), func(t *testing.T) {
				n := batch / m
				// One process, one micro-batch at a time, and the whole batch at
				// once (which agrees to rounding).
				micro, err := referenceInfer(tm, n, m)
				require.NoError(t, err)
				full, err := referenceInfer(tm, batch, 1)
				require.NoError(t, err)
				var got []float64
				errs := runRanks(t, p, func(pg *dist.ProcessGroup) error {
					ctx := context.Background()
					pl, err := New(ctx, pg, tm.stageBuilder(p, pg.Rank(), n), WithMicroBatches(m))
					if err != nil {
						return err
					}
					defer pl.Close()
					var mine []float64 // only the last stage's Output appends
					for range 2 {      // twice: the second call reuses everything
						mine = mine[:0]
						err := pl.Infer(ctx, tm.Data(0, n, func(mb int, o *tensor.Dense) error {
							mine = append(mine, o.Data().([]float64)...)
							return nil
						}))
						if err != nil {
							return err
						}
					}
					if pl.IsLast() {
						got = mine
					}
					return nil
				})
				for r, err := range errs {
					require.NoError(t, err, "rank %d", r)
				}
				assert.Equal(t, micro, got, "pipeline outputs must be bitwise equal to one process")
				d := maxAbsDiff(t, full, got)
				assert.LessOrEqual(t, d, 1e-12)
				t.Logf("max |out - whole batch in one process| = %.3g", d)
			})
		}
	}
}

func TestInferMatchesSingleProcess(t *testing.T) {
	checkInfer(t, mlpModel(testSizes, tensor.Float64), 8, []int{1, 2, 3}, []int{1, 2, 8})
}

func TestFloat32Pipeline(t *testing.T) {
	// Float32 stages train and infer; outputs match a float32 reference run
	// of the same micro-batches bitwise.
	const p, m, rows = 2, 4, 2
	var losses []float64
	errs := runRanks(t, p, func(pg *dist.ProcessGroup) error {
		ctx := context.Background()
		pl, err := New(ctx, pg, mlpBuilder(testSizes, p, pg.Rank(), rows, tensor.Float32),
			WithMicroBatches(m), WithLoss(mseLoss), WithSchedule(OneFOneB))
		if err != nil {
			return err
		}
		defer pl.Close()
		solver := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(0.2))
		for range 5 {
			loss, err := pl.TrainStep(ctx, mlpData(0, rows, nil))
			if err != nil {
				return err
			}
			if pl.IsLast() {
				losses = append(losses, loss)
			}
			if err := solver.Step(gorgonia.NodesToValueGrads(pl.Learnables())); err != nil {
				return err
			}
		}
		return pl.Infer(ctx, mlpData(0, rows, nil))
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	require.Len(t, losses, 5)
	assert.Less(t, losses[4], losses[0], "training on one batch lowers its loss: %v", losses)
}

func TestShapeMismatch(t *testing.T) {
	cases := []struct {
		name  string
		p     int
		build func(rank int) Builder
		want  StageMismatchError
	}{
		{
			name: "width", p: 2,
			build: func(rank int) Builder {
				if rank == 0 {
					return mlpBuilder([]int{4, 6}, 1, 0, 2, tensor.Float64)
				}
				return mlpBuilder([]int{7, 3}, 1, 0, 2, tensor.Float64)
			},
			want: StageMismatchError{Stage: 0, Rank: 0, NextRank: 1,
				Output: Desc{Shape: tensor.Shape{2, 6}, Dtype: tensor.Float64},
				Input:  Desc{Shape: tensor.Shape{2, 7}, Dtype: tensor.Float64}},
		},
		{
			name: "dtype-middle", p: 3,
			build: func(rank int) Builder {
				dt := tensor.Float64
				if rank == 2 {
					dt = tensor.Float32
				}
				return mlpBuilder([]int{4, 4, 4, 4}, 3, rank, 2, dt)
			},
			want: StageMismatchError{Stage: 1, Rank: 1, NextRank: 2,
				Output: Desc{Shape: tensor.Shape{2, 4}, Dtype: tensor.Float64},
				Input:  Desc{Shape: tensor.Shape{2, 4}, Dtype: tensor.Float32}},
		},
		{
			name: "batch", p: 2,
			build: func(rank int) Builder {
				return mlpBuilder([]int{4, 4, 4}, 2, rank, 2+rank, tensor.Float64)
			},
			want: StageMismatchError{Stage: 0, Rank: 0, NextRank: 1,
				Output: Desc{Shape: tensor.Shape{2, 4}, Dtype: tensor.Float64},
				Input:  Desc{Shape: tensor.Shape{3, 4}, Dtype: tensor.Float64}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			errs := runRanks(t, tc.p, func(pg *dist.ProcessGroup) error {
				pl, err := New(ctx, pg, tc.build(pg.Rank()), WithLoss(mseLoss))
				if err == nil {
					pl.Close()
				}
				return err
			})
			for r, err := range errs {
				var sm *StageMismatchError
				require.ErrorAs(t, err, &sm, "rank %d", r)
				assert.Equal(t, tc.want, *sm, "rank %d", r)
			}
			t.Log(errs[0])
		})
	}
}

func TestConfigMismatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := runRanks(t, 2, func(pg *dist.ProcessGroup) error {
		pl, err := New(ctx, pg, mlpBuilder(testSizes, 2, pg.Rank(), 2, tensor.Float64),
			WithLoss(mseLoss), WithMicroBatches(2+2*pg.Rank()))
		if err == nil {
			pl.Close()
		}
		return err
	})
	for r, err := range errs {
		require.ErrorIs(t, err, ErrConfigMismatch, "rank %d", r)
	}
	t.Log(errs[0])
}

// TestKilledStage kills one stage in the middle of training: every other
// stage must fail with a *dist.PeerError naming it, within 5 s.
func TestKilledStage(t *testing.T) {
	for _, victim := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("victim%d", victim), func(t *testing.T) {
			const p, m, rows = 3, 4, 2
			ts := transporttest.NewLocal(t, p)
			var killedAt time.Time
			var mu sync.Mutex
			failedAt := make([]time.Time, p)
			errs := runOn(t, ts, func(pg *dist.ProcessGroup) error {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				r := pg.Rank()
				pl, err := New(ctx, pg, mlpBuilder(testSizes, p, r, rows, tensor.Float64),
					WithMicroBatches(m), WithLoss(mseLoss))
				if err != nil {
					return err
				}
				defer pl.Close()
				for step := 0; ; step++ {
					d := mlpData(step, rows, nil)
					if r == victim && step == 3 {
						// Die in the middle of a step, as a crash would.
						kill := func() {
							mu.Lock()
							killedAt = time.Now()
							mu.Unlock()
							ts[r].Kill()
						}
						switch {
						case pl.IsFirst():
							in := d.Input
							d.Input = func(mb int, t *tensor.Dense) error {
								if mb == 2 {
									kill()
								}
								return in(mb, t)
							}
						default:
							tg := d.Target
							d.Target = func(mb int, t *tensor.Dense) error {
								if mb == 2 {
									kill()
								}
								return tg(mb, t)
							}
						}
						if !pl.IsFirst() && !pl.IsLast() {
							// A middle stage has no callbacks: die before the step.
							kill()
						}
					}
					if _, err := pl.TrainStep(ctx, d); err != nil {
						mu.Lock()
						failedAt[r] = time.Now()
						mu.Unlock()
						return err
					}
				}
			})
			for r, err := range errs {
				if r == victim {
					continue
				}
				var pe *dist.PeerError
				require.ErrorAs(t, err, &pe, "rank %d: %v", r, err)
				assert.Equal(t, victim, pe.Rank, "rank %d: %v", r, err)
				assert.ErrorIs(t, err, dist.ErrPeerLost, "rank %d", r)
				assert.Less(t, failedAt[r].Sub(killedAt), 5*time.Second, "rank %d", r)
				t.Logf("rank %d after %v: %v", r, failedAt[r].Sub(killedAt), err)
			}
		})
	}
}

// TestStageFailureAborts makes the last stage's target callback fail: the
// other stages fail with a *dist.PeerError wrapping ErrStageFailed, and
// every later call fails with ErrBroken.
func TestStageFailureAborts(t *testing.T) {
	const p, m, rows = 3, 2, 2
	boom := errors.New("boom")
	later := make([]error, p)
	errs := runRanks(t, p, func(pg *dist.ProcessGroup) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		r := pg.Rank()
		pl, err := New(ctx, pg, mlpBuilder(testSizes, p, r, rows, tensor.Float64), WithMicroBatches(m), WithLoss(mseLoss))
		if err != nil {
			return err
		}
		defer pl.Close()
		d := mlpData(0, rows, nil)
		if pl.IsLast() {
			d.Target = func(mb int, t *tensor.Dense) error { return boom }
		}
		_, err = pl.TrainStep(ctx, d)
		_, later[r] = pl.TrainStep(ctx, d)
		return err
	})
	require.ErrorIs(t, errs[2], boom)
	for r := range 2 {
		var pe *dist.PeerError
		require.ErrorAs(t, errs[r], &pe, "rank %d", r)
		assert.Equal(t, 2, pe.Rank)
		assert.ErrorIs(t, errs[r], ErrStageFailed)
		t.Logf("rank %d: %v", r, errs[r])
	}
	for r := range p {
		assert.ErrorIs(t, later[r], ErrBroken, "rank %d", r)
	}
}

// TestCallMismatch makes stages call different methods, or one stage make a
// call the others do not: instead of waiting for their contexts, every
// stage fails promptly with ErrCallMismatch, the stage that found it naming
// both calls.
func TestCallMismatch(t *testing.T) {
	const m, rows = 2, 2
	for _, tc := range []struct {
		name  string
		p     int
		calls func(stage int) []string // the calls each stage makes, in order
	}{
		{"p2/infer-vs-train", 2, func(s int) []string {
			return []string{[]string{"infer", "train"}[s], "train"}
		}},
		{"p3/last-infers", 3, func(s int) []string {
			if s == 2 {
				return []string{"infer", "train"}
			}
			return []string{"train", "train"}
		}},
		{"p3/extra-call", 3, func(s int) []string {
			if s == 1 {
				return []string{"train", "train", "train"}
			}
			return []string{"train", "infer", "infer"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := make([][]error, tc.p)
			start := time.Now()
			var called sync.WaitGroup // no stage closes its group before all made their calls
			called.Add(tc.p)
			setupErrs := runRanks(t, tc.p, func(pg *dist.ProcessGroup) error {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				finished := sync.OnceFunc(called.Done)
				defer finished()
				r := pg.Rank()
				pl, err := New(ctx, pg, mlpBuilder(testSizes, tc.p, r, rows, tensor.Float64), WithMicroBatches(m),
					WithLoss(mseLoss), WithInference(true))
				if err != nil {
					return err
				}
				defer pl.Close()
				for _, call := range tc.calls(r) {
					d := mlpData(0, rows, nil)
					if call == "infer" {
						err = pl.Infer(ctx, d)
					} else {
						_, err = pl.TrainStep(ctx, d)
					}
					errs[r] = append(errs[r], err)
				}
				if last := len(errs[r]) - 1; r == 0 && errs[r][last] == nil {
					// The first stage's Infer only sends, so it can finish
					// before a later stage finds the mismatch; the group
					// fails then, and its next call would report it.
					select {
					case <-pg.Failed():
						errs[r][last] = pl.Infer(ctx, mlpData(0, rows, nil))
					case <-ctx.Done():
					}
				}
				finished()
				all := make(chan struct{})
				go func() { called.Wait(); close(all) }()
				select {
				case <-all:
				case <-ctx.Done():
				}
				return nil
			})
			took := time.Since(start)
			assert.Less(t, took, 5*time.Second, "no stage waits for its context")
			found := 0
			for r := range tc.p {
				// Every stage's last call fails with the mismatch — or its
				// New, if another stage's first call found it meanwhile.
				last := setupErrs[r]
				if len(errs[r]) > 0 {
					require.NoError(t, last, "stage %d", r)
					last = errs[r][len(errs[r])-1]
				}
				require.ErrorIs(t, last, ErrCallMismatch, "stage %d: %v", r, errs[r])
				var pe *dist.PeerError
				if !errors.As(last, &pe) {
					found++
					assert.Contains(t, last.Error(), "but stage", "the finder names both calls")
				}
				t.Logf("stage %d: %v", r, errs[r])
			}
			assert.GreaterOrEqual(t, found, 1, "a stage found the mismatch itself")
		})
	}
}

// TestBadCallHeader: a malformed call header from a neighbour is a
// protocol error naming that rank, not a hang or a misread call.
func TestBadCallHeader(t *testing.T) {
	const rows = 2
	errs := runRanks(t, 2, func(pg *dist.ProcessGroup) error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		r := pg.Rank()
		pl, err := New(ctx, pg, mlpBuilder(testSizes, 2, r, rows, tensor.Float64), WithInference(true))
		if err != nil {
			return err
		}
		defer pl.Close()
		if r == 0 {
			// Not a call: three bytes where a 13-byte header belongs.
			return pg.Send(ctx, 1, DefaultTagBase+tagCall, []byte{1, 2, 3})
		}
		return pl.Infer(ctx, mlpData(0, rows, nil))
	})
	require.NoError(t, errs[0])
	var pe *dist.PeerError
	require.ErrorAs(t, errs[1], &pe)
	assert.Equal(t, 0, pe.Rank)
	assert.ErrorIs(t, errs[1], dist.ErrProtocol)
}

func TestContextCancel(t *testing.T) {
	// Stage 1 never calls TrainStep; stage 0's context ends: it fails with
	// the context's error and stage 1's next call fails with ErrStageFailed.
	const p = 2
	errs := runRanks(t, p, func(pg *dist.ProcessGroup) error {
		r := pg.Rank()
		pl, err := New(context.Background(), pg, mlpBuilder(testSizes, p, r, 2, tensor.Float64),
			WithMicroBatches(2), WithLoss(mseLoss))
		if err != nil {
			return err
		}
		defer pl.Close()
		if r == 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			_, err := pl.TrainStep(ctx, mlpData(0, 2, nil))
			return err
		}
		time.Sleep(300 * time.Millisecond) // the notice may arrive before or during the call
		_, err = pl.TrainStep(context.Background(), mlpData(0, 2, nil))
		if !errors.Is(err, ErrStageFailed) {
			return fmt.Errorf("first call: %w", err)
		}
		_, err = pl.TrainStep(context.Background(), mlpData(0, 2, nil))
		return err
	})
	require.ErrorIs(t, errs[0], context.DeadlineExceeded)
	require.ErrorIs(t, errs[1], ErrStageFailed)
	require.ErrorIs(t, errs[1], ErrBroken)
}

func TestOptionsValidation(t *testing.T) {
	for _, o := range []Option{WithMicroBatches(0), WithSchedule(7), WithLoss(nil), WithTargetShape(),
		WithRanks(), WithRanks(0, 0), WithTagBase(dist.TagReservedBase - 1), WithBuildLock(nil)} {
		require.ErrorIs(t, o(new(config)), ErrInvalidArgument)
	}
	ts := transporttest.NewLocal(t, 2)
	pg, err := dist.New(ts[0])
	require.NoError(t, err)
	defer pg.Close()
	_, err = New(context.Background(), pg, mlpBuilder(testSizes, 2, 0, 2, tensor.Float64), WithRanks(1))
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = New(context.Background(), pg, nil)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

func TestSchedules(t *testing.T) {
	str := func(s Schedule, l layout, d int) string {
		ps, err := plan(s, l, d)
		require.NoError(t, err)
		out := ""
		for _, x := range ps {
			out += fmt.Sprintf("%v%d ", x.kind, x.mb)
			if l.v > 1 {
				out = out[:len(out)-1] + fmt.Sprintf("/%d ", x.chunk)
			}
		}
		return out
	}
	l := layout{p: 3, v: 1, m: 4}
	assert.Equal(t, "F0 F1 F2 B0 F3 B1 B2 B3 ", str(OneFOneB, l, 0))
	assert.Equal(t, "F0 F1 B0 F2 B1 F3 B2 B3 ", str(OneFOneB, l, 1))
	assert.Equal(t, "FB0 FB1 FB2 FB3 ", str(OneFOneB, l, 2))
	assert.Equal(t, "F0 F1 F2 F3 B0 B1 B2 B3 ", str(GPipe, l, 0))
	assert.Equal(t, "F0 B0 ", str(OneFOneB, layout{p: 3, v: 1, m: 1}, 0))
	// ZB-H1: stage d postpones d weight passes to the end.
	assert.Equal(t, "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3 ", str(ZeroBubble, l, 0))
	assert.Equal(t, "F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3 ", str(ZeroBubble, l, 1))
	assert.Equal(t, "FB0 FB1 FB2 W0 FB3 W1 W2 W3 ", str(ZeroBubble, l, 2))
	// Interleaved, 2 ranks of 2 chunks (virtual stages 0, 2 on rank 0; 1,
	// 3 on rank 1), 4 micro-batches: the last virtual stage's forward is
	// its backward too.
	l = layout{p: 2, v: 2, m: 4}
	assert.Equal(t, "F0/0 F1/0 F0/1 F1/1 F2/0 B0/1 F3/0 B1/1 F2/1 B0/0 F3/1 B1/0 B2/1 B3/1 B2/0 B3/0 ", str(Interleaved, l, 0))
	assert.Equal(t, "F0/0 F1/0 FB0/1 FB1/1 F2/0 B0/0 F3/0 B1/0 FB2/1 FB3/1 B2/0 B3/0 ", str(Interleaved, l, 1))
}

func TestStatsAndBubble(t *testing.T) {
	res := runTraining(t, mlpModel(testSizes, tensor.Float64), 2, 4, 8, 1, 0.1)
	for r, s := range res {
		st := s.stats
		assert.Positive(t, st.Busy)
		assert.LessOrEqual(t, st.Busy, st.Wall())
		if r == 1 {
			assert.Len(t, st.Events, 4) // FB x4
		} else {
			assert.Len(t, st.Events, 8) // F x4, B x4
		}
		t.Logf("stage %d: wall %v busy %v idle %.2f", r, st.Wall(), st.Busy, st.IdleFraction())
	}
}

// TestSlotsShareParameters checks that every graph of a stage uses the
// primary stage's parameter tensors, and that a solver that replaces the
// tensors instead of updating them in place is still seen by all graphs.
func TestSlotsShareParameters(t *testing.T) {
	const batch, m, steps, lr = 8, 4, 3, 0.1
	tm := mlpModel(testSizes, tensor.Float64)
	ref, err := reference(tm, batch, steps, lr)
	require.NoError(t, err)
	res := make([]refResult, 2)
	errs := runRanks(t, 2, func(pg *dist.ProcessGroup) error {
		ctx := context.Background()
		pl, err := New(ctx, pg, tm.stageBuilder(2, pg.Rank(), batch/m), WithMicroBatches(m), WithLoss(tm.Loss))
		if err != nil {
			return err
		}
		defer pl.Close()
		for _, ch := range pl.chunks {
			for _, s := range append(slices.Clone(ch.train), ch.infer) {
				for j, n := range s.params {
					if n.Value() != ch.params[j].Value() {
						return fmt.Errorf("parameter %s of a graph is not the primary's tensor", n.Name())
					}
				}
			}
		}
		solver := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(lr))
		for step := range steps {
			res[pg.Rank()].out = res[pg.Rank()].out[:0]
			loss, err := pl.TrainStep(ctx, tm.Data(step, batch/m, func(mb int, o *tensor.Dense) error {
				res[pg.Rank()].out = append(res[pg.Rank()].out, o.Data().([]float64)...)
				return nil
			}))
			if err != nil {
				return err
			}
			res[pg.Rank()].loss = loss
			if step == steps-1 {
				break
			}
			if err := solver.Step(gorgonia.NodesToValueGrads(pl.Learnables())); err != nil {
				return err
			}
			for _, n := range pl.Learnables() { // replace every tensor by a copy
				if err := gorgonia.Let(n, n.Value().(*tensor.Dense).Clone()); err != nil {
					return err
				}
			}
		}
		res[pg.Rank()].grads, err = gradsOf(pl.Learnables())
		return err
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	_, err = compareTraining(append(res[0].grads, res[1].grads...), res[1], ref, 1e-12)
	require.NoError(t, err)
}

// TestBuildFailure: a stage whose builder fails tells the others, whose New
// fails at once with a *dist.PeerError wrapping ErrStageFailed.
func TestBuildFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	bad := errors.New("no such checkpoint")
	start := time.Now()
	errs := runRanks(t, 3, func(pg *dist.ProcessGroup) error {
		build := mlpBuilder(testSizes, 3, pg.Rank(), 2, tensor.Float64)
		if pg.Rank() == 1 {
			build = func(*gorgonia.ExprGraph) (Stage, error) { return nil, bad }
		}
		pl, err := New(ctx, pg, build, WithLoss(mseLoss))
		if err == nil {
			pl.Close()
		}
		return err
	})
	assert.Less(t, time.Since(start), 5*time.Second)
	require.ErrorIs(t, errs[1], bad)
	for _, r := range []int{0, 2} {
		var pe *dist.PeerError
		require.ErrorAs(t, errs[r], &pe, "rank %d", r)
		assert.Equal(t, 1, pe.Rank)
		assert.ErrorIs(t, errs[r], ErrStageFailed)
	}
	t.Log(errs[0])
}

// TestWithRanks runs a two-stage pipeline on ranks 2 and 0 of a 3-rank
// group (stage 0 on rank 2); rank 1 is not part of it.
func TestWithRanks(t *testing.T) {
	const batch, m, steps, lr = 8, 4, 2, 0.1
	tm := mlpModel(testSizes, tensor.Float64)
	ref, err := reference(tm, batch, steps, lr)
	require.NoError(t, err)
	ranks := []int{2, 0}
	res := make([]refResult, 3)
	errs := runRanks(t, 3, func(pg *dist.ProcessGroup) error {
		stage := slices.Index(ranks, pg.Rank())
		if stage < 0 {
			return nil
		}
		ctx := context.Background()
		pl, err := New(ctx, pg, tm.stageBuilder(2, stage, batch/m), WithRanks(ranks...),
			WithMicroBatches(m), WithLoss(tm.Loss))
		if err != nil {
			return err
		}
		defer pl.Close()
		if pl.StageIndex() != stage || pl.NumStages() != 2 {
			return fmt.Errorf("stage %d of %d", pl.StageIndex(), pl.NumStages())
		}
		solver := gorgonia.NewVanillaSolver(gorgonia.WithLearnRate(lr))
		for step := range steps {
			loss, err := pl.TrainStep(ctx, tm.Data(step, batch/m, nil))
			if err != nil {
				return err
			}
			res[stage].loss = loss
			if step < steps-1 {
				if err := solver.Step(gorgonia.NodesToValueGrads(pl.Learnables())); err != nil {
					return err
				}
			}
		}
		res[stage].grads, err = gradsOf(pl.Learnables())
		return err
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	_, err = compareTraining(append(res[0].grads, res[1].grads...), res[1], ref, 1e-12)
	require.NoError(t, err)
}
