//go:build linux

package shm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/shm/internal/ring"
)

// The test binary turns into rank 1 of a 2-rank job when envChild is set;
// the job meets under the socket name in envName.
const (
	envChild = "GDIST_SHM_TEST_CHILD"
	envName  = "GDIST_SHM_TEST_NAME"
)

// Child modes.
const (
	childMidMessage = "mid-message" // write half a large message into the ring, then wait to be killed
	childReady      = "ready"       // send "ready", then wait (to be stopped or killed)
	childExit       = "exit"        // send "bye", close and exit normally
	childPause      = "pause"       // childReady with the default heartbeat (to be stopped, resumed and stopped again)
)

const midMessageLen = 8 << 20

// childModes holds the modes defined elsewhere.
var childModes = map[string]func(context.Context, *Transport) error{}

func runChild(mode string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hb := WithHeartbeat(50*time.Millisecond, 30*time.Second)
	if mode == childPause {
		hb = WithHeartbeat(DefaultHeartbeatInterval, DefaultHeartbeatTimeout)
	}
	t, err := Rendezvous(ctx, 1, 2, os.Getenv(envName), WithToken(testToken), WithLogger(quiet()),
		hb, WithSingleCopy(256<<10))
	if err != nil {
		return err
	}
	if f := childModes[mode]; f != nil {
		return f(ctx, t)
	}
	switch mode {
	case childMidMessage:
		p := t.peers[0].Load()
		p.wmu.Lock() // no Send can interfere: this rank writes half a record by hand
		rh := ring.Header{Tag: 5, Len: midMessageLen}
		if _, err := p.waitSpace(ring.HeaderSize + 4096); err != nil {
			return err
		}
		p.out.WriteHeader(&rh)
		p.out.Write(make([]byte, 4096))
		p.out.Publish()
		p.peerBell.Ring()
		fmt.Println("ready") // the parent kills us now
		<-ctx.Done()
		return errors.New("not killed")
	case childReady, childPause:
		if err := t.Send(ctx, 0, 1, transport.Header{}, []byte("ready")); err != nil {
			return err
		}
		_, err := t.Recv(ctx, 0, 2) // until stopped and killed
		return err
	case childExit:
		if err := t.Send(ctx, 0, 1, transport.Header{}, []byte("bye")); err != nil {
			return err
		}
		return t.Close()
	}
	return errors.New("unknown child mode " + mode)
}

// childEcho: receive echoMsgs large messages and send each back.
const (
	childEcho = "echo"
	echoMsgs  = 4
	echoSize  = 3<<20 + 17
)

func init() {
	childModes[childEcho] = func(ctx context.Context, t *Transport) error {
		buf := make([]byte, echoSize)
		for range echoMsgs {
			h, n, err := t.RecvInto(ctx, 0, 3, buf)
			if err != nil {
				return err
			}
			if err := t.Send(ctx, 0, 3, h, buf[:n]); err != nil {
				return err
			}
		}
		return t.Close()
	}
}
