package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist/transport"
)

// Environment that turns the test binary into a child rank for the tests
// that need another OS process (to kill it, stop it, or let it compute with
// GOMAXPROCS=1).
const (
	envChild       = "GDIST_TCP_TEST_CHILD"  // the role: "killed", "freeze", "compute" or "hog"
	envChildMaster = "GDIST_TCP_TEST_MASTER" // role killed: rank 0's address
	envChildAddrs  = "GDIST_TCP_TEST_ADDRS"  // roles freeze, compute: every rank's address, comma-separated; the child is the last rank
	envChildHB     = "GDIST_TCP_TEST_HB"     // roles freeze, compute: heartbeat timeout (default: the default)
	envChildFor    = "GDIST_TCP_TEST_FOR"    // role compute: how long to compute
)

func TestMain(m *testing.M) {
	if role := os.Getenv(envChild); role != "" {
		if err := runChild(role); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func runChild(role string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch role {
	case "killed":
		return runKilled(ctx)
	case "hog": // burn a CPU until killed
		for x := 0; ; x++ {
			if x == -1 {
				return nil
			}
		}
	}
	addrs := strings.Split(os.Getenv(envChildAddrs), ",")
	rank := len(addrs) - 1
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addrs[rank])
	if err != nil {
		return err
	}
	opts := []Option{WithToken(testToken), WithLogger(quiet())}
	if v := os.Getenv(envChildHB); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		opts = append(opts, WithHeartbeat(0, d))
	}
	t, err := New(ctx, rank, len(addrs), ln, addrs, opts...)
	if err != nil {
		return err
	}
	defer t.Close()
	for r := range rank {
		if err := t.Send(ctx, r, 1, transport.Header{}, []byte("ready")); err != nil {
			return err
		}
	}
	switch role {
	case "freeze":
		// Wait to be stopped and killed.
		_, err = t.Recv(ctx, 0, 2)
	case "compute":
		d, perr := time.ParseDuration(os.Getenv(envChildFor))
		if perr != nil {
			return perr
		}
		n, cerr := compute(d)
		if cerr != nil {
			return cerr
		}
		for r := range rank {
			if err := t.Send(ctx, r, 1, transport.Header{}, []byte(strconv.Itoa(n))); err != nil {
				return err
			}
		}
		_, err = t.Recv(ctx, 0, 2) // until rank 0 closes
		if errors.Is(err, transport.ErrPeerClosed) {
			err = nil
		}
	default:
		return fmt.Errorf("unknown role %q", role)
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// compute runs a Gorgonia graph of 256x256 matrix products on a tape
// machine for d and returns how many it ran.
func compute(d time.Duration) (int, error) {
	g := gorgonia.NewGraph()
	const n = 256
	data := make([]float64, n*n)
	for i := range data {
		data[i] = float64(i%7) / 7
	}
	a := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(n, n), gorgonia.WithName("a"),
		gorgonia.WithValue(tensor.New(tensor.WithShape(n, n), tensor.WithBacking(data))))
	b := gorgonia.NewMatrix(g, tensor.Float64, gorgonia.WithShape(n, n), gorgonia.WithName("b"),
		gorgonia.WithValue(tensor.New(tensor.WithShape(n, n), tensor.WithBacking(append([]float64(nil), data...)))))
	c, err := gorgonia.Mul(a, b)
	if err != nil {
		return 0, err
	}
	if _, err := gorgonia.Mul(c, b); err != nil {
		return 0, err
	}
	vm := gorgonia.NewTapeMachine(g)
	defer vm.Close()
	count := 0
	for end := time.Now().Add(d); time.Now().Before(end); count++ {
		if err := vm.RunAll(); err != nil {
			return count, err
		}
		vm.Reset()
	}
	return count, nil
}

// runKilled is rank 1 of a 2-rank job whose rank 0 listens at
// $GDIST_TCP_TEST_MASTER. It says hello and then waits to be killed.
func runKilled(ctx context.Context) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addrs := []string{os.Getenv(envChildMaster), ln.Addr().String()}
	t, err := New(ctx, 1, 2, ln, addrs, WithToken(testToken), WithLogger(quiet()))
	if err != nil {
		return err
	}
	if err := t.Send(ctx, 0, 1, transport.Header{}, []byte("ready")); err != nil {
		return err
	}
	_, err = t.Recv(ctx, 0, 2) // until killed
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
