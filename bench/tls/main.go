// Command tls measures what TLS costs gdist's TCP links: between the same two
// processes, in the same run, it streams 16 MiB messages and all-reduces
// 4096 float32 over a plain link and over a TLS 1.3 link (mutual
// authentication, package tcp's WithTLS), alternating the two round by
// round, and measures raw TCP (internal/rawtcp) as the baseline. Both links
// are made alike (tcp.Listen and tcp.Dial, the job token's handshake), so
// the only difference is TLS. It prints, per metric, the medians over the
// rounds and the ratios TLS/plain and each to raw TCP.
//
// Run alone, it makes a throwaway CA and certificates (internal/certs),
// starts both ranks itself (re-executed through internal/launch, GOMAXPROCS=1
// each) and prints rank 0's report.
//
// # Usage
//
//	go run ./bench/tls
//	go run ./bench/tls -rounds 9 -allreduce-iters 2000
//
// Flags:
//
//	-rounds N           alternating rounds (default 5)
//	-stream-msgs N      16 MiB messages per stream measurement (default 8)
//	-allreduce-iters N  all-reduces of 4096 float32 per measurement (default 1000)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gdist/gdist"
	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/tcp"
	"github.com/gdist/gdist/internal/certs"
	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launch"
	"github.com/gdist/gdist/internal/rawtcp"
)

var errUsage = errors.New("tls: usage")

// certsEnv names the directory of the certificates the parent made.
const certsEnv = "GDIST_TLS_BENCH_CERTS"

const (
	streamSize = 16 << 20
	reduceLen  = 4096
	tagAddr    = 1 // rank 0 tells rank 1 where its links listen
	tagRawAddr = 2
	tagStream  = 3
	tagAck     = 4
)

type config struct {
	Rounds      int
	StreamMsgs  int
	ReduceIters int
}

func main() { cli.Main("tls", errUsage, run) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg config
	fs := flag.NewFlagSet("tls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&cfg.Rounds, "rounds", 5, "alternating rounds")
	fs.IntVar(&cfg.StreamMsgs, "stream-msgs", 8, "16 MiB messages per stream measurement")
	fs.IntVar(&cfg.ReduceIters, "allreduce-iters", 1000, "all-reduces of 4096 float32 per measurement")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return err
	}
	if cfg.Rounds < 1 || cfg.StreamMsgs < 1 || cfg.ReduceIters < 1 {
		fmt.Fprintln(stderr, "tls: -rounds, -stream-msgs and -allreduce-iters must be positive")
		return errUsage
	}
	if dir := os.Getenv(certsEnv); dir != "" {
		return rank(ctx, cfg, dir, stdout)
	}
	dir, err := os.MkdirTemp("", "gdist-tls-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ca, err := certs.NewCA("gdist TLS bench CA")
	if err != nil {
		return err
	}
	leaf, err := ca.Issue("rank", "127.0.0.1")
	if err != nil {
		return err
	}
	if _, err := leaf.Write(dir); err != nil {
		return err
	}
	r, err := launch.Start(ctx, launch.Job{
		Spec:   launch.Spec{NProc: 2},
		Args:   args,
		Env:    []string{certsEnv + "=" + dir, "GDIST_TRANSPORT=tcp"},
		Procs:  1,
		Output: func(rank int) (io.Writer, io.Writer) { return launch.Prefixed(stdout, stderr)(rank) },
	})
	if err != nil {
		return err
	}
	return r.Wait()
}

// rank is one of the two processes.
func rank(ctx context.Context, cfg config, dir string, out io.Writer) error {
	pg, err := gdist.InitFromEnv(ctx) // the control channel: addresses and the raw baseline
	if err != nil {
		return err
	}
	defer pg.Close()
	tlsCfg, err := tcp.LoadTLS(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "ca.pem"), "")
	if err != nil {
		return err
	}
	token := []byte(os.Getenv(gdist.EnvToken))
	plain, err := link(ctx, pg, token)
	if err != nil {
		return fmt.Errorf("plain link: %w", err)
	}
	defer plain.Close()
	sealed, err := link(ctx, pg, token, tcp.WithTLS(tlsCfg))
	if err != nil {
		return fmt.Errorf("TLS link: %w", err)
	}
	defer sealed.Close()
	pgPlain, err := dist.New(plain)
	if err != nil {
		return err
	}
	defer pgPlain.Close()
	pgTLS, err := dist.New(sealed)
	if err != nil {
		return err
	}
	defer pgTLS.Close()
	raw, err := rawtcp.Connect(ctx, pg, pg.Rank(), 1-pg.Rank(), tagRawAddr)
	if err != nil {
		return err
	}
	defer raw.Close()

	var f figures
	for range cfg.Rounds {
		rf, err := raw.Measure(ctx, rawtcp.Config{StreamBytes: cfg.StreamMsgs * streamSize, Chunk: streamSize})
		if err != nil {
			return err
		}
		f.rawStream = append(f.rawStream, rf.StreamGBps)
		f.rawRTT = append(f.rawRTT, rf.LatencyUs*2)
		for _, side := range []struct {
			tr     transport.Transport
			pg     *dist.ProcessGroup
			stream *[]float64
			reduce *[]float64
		}{{plain, pgPlain, &f.plainStream, &f.plainReduce}, {sealed, pgTLS, &f.tlsStream, &f.tlsReduce}} {
			gbps, err := stream(ctx, side.tr, cfg.StreamMsgs)
			if err != nil {
				return err
			}
			us, err := allReduce(ctx, side.pg, cfg.ReduceIters)
			if err != nil {
				return err
			}
			*side.stream = append(*side.stream, gbps)
			*side.reduce = append(*side.reduce, us)
		}
	}
	if pg.Rank() == 0 {
		f.print(out, cfg)
	}
	return nil
}

// link makes a link between the two ranks: rank 0 listens, tells rank 1
// where over pg, and accepts; rank 1 dials.
func link(ctx context.Context, pg *dist.ProcessGroup, token []byte, opts ...tcp.Option) (*tcp.Transport, error) {
	opts = append([]tcp.Option{tcp.WithToken(token)}, opts...)
	if pg.Rank() == 0 {
		l, err := tcp.Listen(ctx, "127.0.0.1:0", 2, opts...)
		if err != nil {
			return nil, err
		}
		defer l.Close()
		if err := pg.Send(ctx, 1, tagAddr, []byte(l.Addr().String())); err != nil {
			return nil, err
		}
		tr, _, err := l.Accept(ctx)
		return tr, err
	}
	addr, err := pg.Recv(ctx, 0, tagAddr)
	if err != nil {
		return nil, err
	}
	return tcp.Dial(ctx, string(addr), 1, 2, opts...)
}

// stream sends n 16 MiB messages from the link's rank 0 to its rank 1,
// which acknowledges the last, and returns GB/s (on both sides).
func stream(ctx context.Context, tr transport.Transport, n int) (float64, error) {
	buf := make([]byte, streamSize)
	start := time.Now()
	if tr.Rank() == 0 {
		for range n {
			if err := tr.Send(ctx, 1, tagStream, transport.Header{}, buf); err != nil {
				return 0, err
			}
		}
		if _, _, err := tr.RecvInto(ctx, 1, tagAck, buf[:1]); err != nil {
			return 0, err
		}
	} else {
		for range n {
			if _, _, err := tr.RecvInto(ctx, 0, tagStream, buf); err != nil {
				return 0, err
			}
		}
		if err := tr.Send(ctx, 0, tagAck, transport.Header{}, buf[:1]); err != nil {
			return 0, err
		}
	}
	return float64(n*streamSize) / time.Since(start).Seconds() / 1e9, nil
}

// allReduce times iters sum all-reduces of 4096 float32 (after 10% as
// many untimed) and returns the mean in microseconds.
func allReduce(ctx context.Context, pg *dist.ProcessGroup, iters int) (float64, error) {
	x := make([]float32, reduceLen)
	for range iters / 10 {
		if err := pg.AllReduce(ctx, dist.F32(x), dist.Sum); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	for range iters {
		if err := pg.AllReduce(ctx, dist.F32(x), dist.Sum); err != nil {
			return 0, err
		}
	}
	return float64(time.Since(start).Microseconds()) / float64(iters), nil
}

// figures are one value per round of each measurement.
type figures struct {
	rawStream, plainStream, tlsStream []float64 // GB/s
	rawRTT, plainReduce, tlsReduce    []float64 // us
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}

func (f *figures) print(w io.Writer, cfg config) {
	fmt.Fprintf(w, "TLS 1.3 against plain TCP links between 2 processes (GOMAXPROCS=1 each), medians of %d alternating rounds\n", cfg.Rounds)
	fmt.Fprintf(w, "%-34s %10s %10s %10s %10s %10s\n", "metric", "raw TCP", "plain", "TLS", "TLS/plain", "TLS/raw")
	rs, ps, ts := median(f.rawStream), median(f.plainStream), median(f.tlsStream)
	fmt.Fprintf(w, "%-34s %10.2f %10.2f %10.2f %10.2f %10.2f\n", "stream of 16 MiB messages, GB/s", rs, ps, ts, ts/ps, ts/rs)
	rr, pr, tr := median(f.rawRTT), median(f.plainReduce), median(f.tlsReduce)
	fmt.Fprintf(w, "%-34s %10.1f %10.1f %10.1f %10.2f %10.2f\n", "all-reduce 4096 float32, us", rr, pr, tr, tr/pr, tr/rr)
	fmt.Fprintln(w, "(raw TCP's column for the all-reduce is its 8-byte round trip: the least an exchange costs)")
}
