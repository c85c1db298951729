package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gdist/gdist/dist/transport"
)

// Environment switch that turns the test binary into a child rank for
// TestKilledPeer.
const (
	envChild       = "GDIST_TCP_TEST_CHILD"
	envChildMaster = "GDIST_TCP_TEST_MASTER"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		if err := runChild(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// runChild is rank 1 of a 2-rank job whose rank 0 listens at
// $GDIST_TCP_TEST_MASTER. It says hello and then waits to be killed.
func runChild() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
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
