//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/gdist/gdist/dist/fed"
)

// samples is client rank's sample count: the weights differ.
func samples(rank int) int { return 10 * rank }

// step is what client rank adds to weight i in round k.
func step(rank, k, i int) float32 {
	return float32(rank*(i%7+1)+k) * 1e-3
}

// leader leads the federation for cfg.Rounds rounds and checks the model
// after each: it must be exactly FedAvg of the clients that took part.
// It prints one line per round for the parent.
func leader(ctx context.Context, cfg config, out io.Writer) error {
	job, err := fed.FromEnv()
	if err != nil {
		return err
	}
	model := make([]float32, cfg.Dim)
	l, err := job.Lead(ctx, model, fed.WithRoundTimeout(10*time.Second))
	if err != nil {
		return err
	}
	defer l.Close()
	for k := 1; k <= cfg.Rounds; k++ {
		res, err := l.Round(ctx)
		if err != nil {
			return fmt.Errorf("round %d: %w", k, err)
		}
		want := fedavg(model, res.Reported, k)
		got := l.Model()
		for i := range want {
			if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
				return fmt.Errorf("round %d: model[%d] = %v, FedAvg of %v gives %v", k, i, got[i], res.Reported, want[i])
			}
		}
		model = got
		fmt.Fprintf(out, "round %d reported %v left %v joined %v\n", res.Round, res.Reported, res.Left, res.Joined)
		time.Sleep(cfg.Pause)
	}
	fmt.Fprintln(out, "leader done")
	return nil
}

// fedavg is the model the leader must hold after round k: package fed's
// arithmetic, with the clients' updates as they compute them.
func fedavg(model []float32, reported []int, k int) []float32 {
	out := make([]float32, len(model))
	copy(out, model)
	if len(reported) == 0 {
		return out
	}
	var total float64
	for _, r := range reported {
		total += float64(samples(r))
	}
	for i, x := range model {
		var s float64
		for _, r := range reported { // increasing rank order, as the leader sums
			w := x + step(r, k, i)
			s += float64(samples(r)) * float64(w-x)
		}
		out[i] = float32(float64(x) + s/total)
	}
	return out
}

// client serves tasks until the federation ends.
func client(ctx context.Context, out io.Writer) error {
	job, err := fed.FromEnv()
	if err != nil {
		return err
	}
	c, err := job.Join(ctx, fed.WithReconnect(30*time.Second, 50*time.Millisecond, 500*time.Millisecond))
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Fprintf(out, "client %d joined\n", job.Rank)
	for {
		task, err := c.Next(ctx)
		if errors.Is(err, fed.ErrFinished) {
			return nil
		}
		if err != nil {
			return err
		}
		w := task.Model
		for i := range w {
			w[i] += step(job.Rank, task.Round, i)
		}
		time.Sleep(10 * time.Millisecond) // "training"
		if err := c.Report(ctx, task, w, samples(job.Rank)); err != nil {
			return err
		}
	}
}
