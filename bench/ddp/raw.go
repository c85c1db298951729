package main

import (
	"context"
	"errors"
	"io"
	"net"
	"time"

	"github.com/gdist/gdist/dist"
)

// raw is the raw-socket baseline: plain TCP between the same two processes,
// measured in the same run as the training benchmark.
type raw struct {
	LatencyUs  float64 `json:"latency_us"`  // half the mean round trip of an 8-byte ping-pong
	StreamGBps float64 `json:"stream_gbps"` // one-way streaming, 1 MiB writes
	// ExchangeMs is the time of what a 2-rank ring all-reduce of Bytes moves,
	// without the reduction: two rounds in which both ranks send Bytes/2 to
	// each other at once. The lower bound for the DDP's comm per step.
	ExchangeMs float64 `json:"exchange_ms"`
	Bytes      int     `json:"bytes"`
}

const (
	tagRawAddr  = 7001
	pingIters   = 2000
	streamBytes = 256 << 20
	streamChunk = 1 << 20
	exchReps    = 50
)

// rawBaseline measures the raw-socket figures between ranks 0 and 1 of a
// 2-rank group: rank 1 listens on loopback and sends its address to rank 0
// through the group, rank 0 dials. Rank 0's figures are the ones to report
// (rank 1 has no stream rate).
func rawBaseline(ctx context.Context, pg *dist.ProcessGroup, exchangeBytes int) (*raw, error) {
	if pg.WorldSize() != 2 {
		return nil, errors.New("bench: the raw baseline needs 2 ranks")
	}
	var conn net.Conn
	if pg.Rank() == 1 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		if err := pg.Send(ctx, 0, tagRawAddr, []byte(ln.Addr().String())); err != nil {
			return nil, err
		}
		if dl, ok := ctx.Deadline(); ok {
			ln.(*net.TCPListener).SetDeadline(dl)
		}
		if conn, err = ln.Accept(); err != nil {
			return nil, err
		}
	} else {
		addr, err := pg.Recv(ctx, 1, tagRawAddr)
		if err != nil {
			return nil, err
		}
		var dl net.Dialer
		if conn, err = dl.DialContext(ctx, "tcp", string(addr)); err != nil {
			return nil, err
		}
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()

	r := &raw{Bytes: exchangeBytes}
	leader := pg.Rank() == 0

	// Ping-pong.
	buf := make([]byte, max(streamChunk, exchangeBytes))
	start := time.Now()
	for range pingIters {
		if leader {
			if _, err := conn.Write(buf[:8]); err != nil {
				return nil, err
			}
			if _, err := io.ReadFull(conn, buf[:8]); err != nil {
				return nil, err
			}
		} else {
			if _, err := io.ReadFull(conn, buf[:8]); err != nil {
				return nil, err
			}
			if _, err := conn.Write(buf[:8]); err != nil {
				return nil, err
			}
		}
	}
	r.LatencyUs = float64(time.Since(start).Microseconds()) / pingIters / 2

	// One-way stream, acknowledged at the end.
	start = time.Now()
	if leader {
		for sent := 0; sent < streamBytes; sent += streamChunk {
			if _, err := conn.Write(buf[:streamChunk]); err != nil {
				return nil, err
			}
		}
		if _, err := io.ReadFull(conn, buf[:1]); err != nil {
			return nil, err
		}
		r.StreamGBps = streamBytes / time.Since(start).Seconds() / 1e9
	} else {
		for got := 0; got < streamBytes; got += streamChunk {
			if _, err := io.ReadFull(conn, buf[:streamChunk]); err != nil {
				return nil, err
			}
		}
		if _, err := conn.Write(buf[:1]); err != nil {
			return nil, err
		}
	}

	// The exchange of a 2-rank ring all-reduce: two rounds, each sending
	// half the buffer both ways at once.
	half := exchangeBytes / 2
	sendBuf := make([]byte, half)
	recvBuf := make([]byte, half)
	start = time.Now()
	for range exchReps {
		for range 2 {
			errc := make(chan error, 1)
			go func() { _, err := conn.Write(sendBuf); errc <- err }()
			_, rerr := io.ReadFull(conn, recvBuf)
			werr := <-errc
			if err := errors.Join(rerr, werr); err != nil {
				return nil, err
			}
		}
	}
	r.ExchangeMs = 1e3 * time.Since(start).Seconds() / exchReps

	return r, nil
}
