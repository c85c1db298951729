package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"gorgonia.org/gorgonia"

	"github.com/gdist/gdist/dist/fed"
	"github.com/gdist/gdist/internal/mnist"
	"github.com/gdist/gdist/train/optim"
)

// evalBatch is the batch of the leader's evaluation graph.
const evalBatch = 1000

// runRank runs this process's rank of the job its launcher describes:
// rank 0 leads, the others are clients.
func runRank(ctx context.Context, cfg config, out io.Writer) error {
	job, err := fed.FromEnv()
	if err != nil {
		return err
	}
	var opts []fed.Option
	if cfg.Heartbeat > 0 {
		opts = append(opts, fed.WithHeartbeat(0, cfg.Heartbeat))
	}
	if job.Rank == 0 {
		return lead(ctx, cfg, job, opts, out)
	}
	return serve(ctx, cfg, job, opts, out)
}

func sizes(cfg config) []int { return []int{784, cfg.Hidden, mnist.Classes} }

// lead runs the rounds and prints, after each, the test accuracy of the
// global model and who took part.
func lead(ctx context.Context, cfg config, job fed.Job, opts []fed.Option, out io.Writer) error {
	_, test, err := mnist.Load(cfg.Data)
	if err != nil {
		return err
	}
	standardize(test)
	eval, err := newNet(sizes(cfg), evalBatch, cfg.Seed, false)
	if err != nil {
		return err
	}
	init := eval.flat()
	if cfg.Secure {
		opts = append(opts, fed.WithSecureAggregation(fed.SecureAggregation{Clip: 8, MaxSamples: 60000, Bits: 64}))
	}
	if cfg.Scaffold {
		opts = append(opts, fed.WithScaffold())
	}
	opts = append(opts, fed.WithServerOptimizer(&fed.FedAvg{LR: cfg.ServerLR}))
	l, err := job.Lead(ctx, init, opts...)
	if err != nil {
		return err
	}
	defer l.Close()
	mode := fmt.Sprintf("FedAvg (server lr %g)", cfg.ServerLR)
	if cfg.Scaffold {
		mode += " with SCAFFOLD"
	}
	if cfg.Secure {
		mode += ", secure aggregation"
	}
	if !cfg.TrainHead {
		mode += ", local training of the hidden layer only"
	}
	fmt.Fprintf(out, "federated: %d clients, %s; MLP %v (%d parameters); %d rounds of %d local epoch(s), batch %d, lr %g\n",
		job.World-1, mode, sizes(cfg), len(init), cfg.Rounds, cfg.LocalEpochs, cfg.Batch, cfg.LR)
	var acc float64
	for k := 1; k <= cfg.Rounds; k++ {
		res, err := l.Round(ctx)
		if err != nil {
			return err
		}
		if acc, err = eval.accuracy(l.Model(), test); err != nil {
			return err
		}
		line := fmt.Sprintf("round %2d/%d  test accuracy %6.2f%%  took part: %-10s", res.Round, cfg.Rounds, 100*acc, list(res.Reported))
		if len(res.Missing) > 0 {
			line += "  missing: " + list(res.Missing)
		}
		if len(res.Left) > 0 {
			line += "  left: " + list(res.Left)
		}
		if len(res.Joined) > 0 {
			line += "  joined: " + list(res.Joined)
		}
		fmt.Fprintf(out, "%s  (%.1fs)\n", line, res.Elapsed.Seconds())
	}
	fmt.Fprintf(out, "federated: final test accuracy %.2f%% after %d rounds\n", 100*acc, cfg.Rounds)
	return nil
}

// list formats ranks as "1 2 4", or "-".
func list(rs []int) string {
	if len(rs) == 0 {
		return "-"
	}
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = fmt.Sprint(r)
	}
	return strings.Join(s, " ")
}

// digitsOf returns the digits client rank (1 to n) holds: a contiguous
// tenth of the labels per n-th, e.g. {0, 1} for client 1 of 5.
func digitsOf(rank, n int) []uint8 {
	var ds []uint8
	for d := range mnist.Classes {
		if d*n/mnist.Classes == rank-1 {
			ds = append(ds, uint8(d))
		}
	}
	return ds
}

// shard returns the indices of the training images of the given digits,
// at most limit of them (0: all).
func shard(set *mnist.Set, digits []uint8, limit int) []int {
	var idx []int
	for i, l := range set.Labels {
		if slices.Contains(digits, l) && (limit == 0 || len(idx) < limit) {
			idx = append(idx, i)
		}
	}
	return idx
}

// serve is a client: for each round it is sampled for, it trains the
// global model on its own digits for the local epochs and reports the new
// weights and how many images it trained on.
func serve(ctx context.Context, cfg config, job fed.Job, opts []fed.Option, out io.Writer) error {
	train, _, err := mnist.Load(cfg.Data)
	if err != nil {
		return err
	}
	standardize(train)
	digits := digitsOf(job.Rank, job.World-1)
	idx := shard(train, digits, cfg.Limit)
	nt, err := newNet(sizes(cfg), cfg.Batch, cfg.Seed, true)
	if err != nil {
		return err
	}
	c, err := job.Join(ctx, opts...)
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(out, "client %d: digits %v, %d training images\n", job.Rank, digits, len(idx))
	for {
		task, err := c.Next(ctx)
		if errors.Is(err, fed.ErrFinished) {
			return nil
		}
		if err != nil {
			return err
		}
		start := time.Now()
		w, err := localTrain(nt, cfg, train, idx, task, job.Rank)
		if err != nil {
			return err
		}
		if err := c.Report(ctx, task, w, len(idx)); err != nil {
			return err
		}
		_ = start
	}
}

// localTrain trains from the task's model for the local epochs with SGD
// and returns the new weights.
func localTrain(nt *net, cfg config, train *mnist.Set, idx []int, task *fed.Task, rank int) ([]float32, error) {
	nt.set(task.Model)
	lr := cfg.LR * math.Pow(cfg.LRDecay, float64(task.Round-1))
	solver, err := optim.NewSGD(optim.WithLearnRate(lr))
	if err != nil {
		return nil, err
	}
	params := nt.m.Learnables()
	trained := params
	if !cfg.TrainHead {
		trained = params[:len(params)-2] // the output layer keeps the global model's values
	}
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(rank)<<32|uint64(task.Round)))
	batch := make([]int, cfg.Batch)
	steps := 0
	for range cfg.LocalEpochs {
		perm := rng.Perm(len(idx))
		for b := 0; b+cfg.Batch <= len(perm); b += cfg.Batch {
			for i := range batch {
				batch[i] = idx[perm[b+i]]
			}
			if err := mnist.Batch(train, batch, nt.xb, nt.yb); err != nil {
				return nil, err
			}
			if err := nt.vm.RunAll(); err != nil {
				return nil, err
			}
			if corr := task.Correction; corr != nil { // SCAFFOLD: g + c - c_i
				for _, p := range params {
					gv, err := p.Grad()
					if err != nil {
						return nil, err
					}
					g := gv.Data().([]float32)
					for j := range g {
						g[j] += corr[j]
					}
					corr = corr[len(g):]
				}
			}
			if err := solver.Step(gorgonia.NodesToValueGrads(trained)); err != nil {
				return nil, err
			}
			nt.vm.Reset()
			steps++
		}
	}
	task.Trained(steps, lr)
	return nt.flat(), nil
}
