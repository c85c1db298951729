package main

import (
	"context"
	"errors"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/internal/rawtcp"
)

// tagRawAddr carries the raw-socket baseline's listener address.
const tagRawAddr = 7001

// rawBaseline measures the raw-socket baseline between the two ranks of a
// 2-rank group with package rawtcp, in the same processes as the training
// benchmark: the 8-byte ping-pong latency, one-way streaming of 256 MiB and
// the time of what a 2-rank ring all-reduce of exchangeBytes moves without
// the reduction (two rounds in which both ranks send half the bytes to
// each other at once), the lower bound for the DDP's comm per step. Rank
// 0's figures are the ones to report (rank 1 has no stream rate).
func rawBaseline(ctx context.Context, pg *dist.ProcessGroup, exchangeBytes int) (*rawtcp.Figures, error) {
	if pg.WorldSize() != 2 {
		return nil, errors.New("bench: the raw baseline needs 2 ranks")
	}
	c, err := rawtcp.Connect(ctx, pg, pg.Rank(), 1-pg.Rank(), tagRawAddr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	f, err := c.Measure(ctx, rawtcp.Config{StreamBytes: 256 << 20, ExchangeBytes: exchangeBytes, ExchangeReps: 50})
	if err != nil {
		return nil, err
	}
	return &f, nil
}
