package fed

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gdist/gdist/dist/transport"
)

// The federation's messages, on the link between the leader (rank 0 of the
// link) and one client (rank 1), all under one tag so that they arrive in
// the order they were sent. spec.md describes them.
const (
	tagFed  uint32 = 1
	version byte   = 1
)

// kind is the type of a message, in its header's first byte.
type kind byte

const (
	kJoin    kind = 1 // client -> leader: this process wants to be a member
	kWelcome kind = 2 // leader -> client: admitted; the current model
	kRefuse  kind = 3 // leader -> client: not admitted (aux: refusal code; payload: why)
	kTask    kind = 4 // leader -> client: train this round from this model
	kUpdate  kind = 5 // client -> leader: this round's update (aux: sample count)
	kFinish  kind = 6 // leader -> client: the federation has ended
	kSecure  kind = 7 // both ways: a stage of secure aggregation (aux: the stage)
)

// taskSecure is the Task aux flag of a round with secure aggregation.
const taskSecure uint32 = 1

// taskScaffold is the Task aux flag of a round with SCAFFOLD: the leader's
// control variate follows the model in the payload.
const taskScaffold uint32 = 2

func (k kind) String() string {
	switch k {
	case kJoin:
		return "join"
	case kWelcome:
		return "welcome"
	case kRefuse:
		return "refuse"
	case kTask:
		return "task"
	case kUpdate:
		return "update"
	case kFinish:
		return "finish"
	case kSecure:
		return "secure"
	}
	return fmt.Sprintf("kind(%d)", byte(k))
}

// Refusal codes (kRefuse's aux).
const (
	refuseBusy     uint32 = 1 // the rank is a member on another link: retry later
	refuseFinished uint32 = 2 // the federation has ended
	refuseVersion  uint32 = 3 // another protocol version
)

// header is the decoded transport.Header of a message: kind, version, the
// round it belongs to and a kind-specific 32-bit value.
type header struct {
	kind  kind
	round uint64
	aux   uint32
}

func (h header) put() transport.Header {
	var b transport.Header
	b[0] = byte(h.kind)
	b[1] = version
	binary.LittleEndian.PutUint64(b[4:], h.round)
	binary.LittleEndian.PutUint32(b[12:], h.aux)
	return b
}

func parseHeader(b transport.Header) (header, error) {
	if b[1] != version {
		return header{}, fmt.Errorf("%w: message of protocol version %d, this is %d", ErrProtocol, b[1], version)
	}
	if b[2] != 0 || b[3] != 0 {
		return header{}, fmt.Errorf("%w: reserved header bytes set", ErrProtocol)
	}
	h := header{kind: kind(b[0]), round: binary.LittleEndian.Uint64(b[4:]), aux: binary.LittleEndian.Uint32(b[12:])}
	if h.kind < kJoin || h.kind > kSecure {
		return header{}, fmt.Errorf("%w: unknown message kind %d", ErrProtocol, b[0])
	}
	return h, nil
}

// joinSize is the size of a Join payload: the process's incarnation (a
// random number, so that the leader's log tells a new process from one that
// reconnects) and the last round it took part in.
const joinSize = 16

type join struct {
	incarnation uint64
	lastRound   uint64
}

func (j join) marshal() []byte {
	b := make([]byte, joinSize)
	binary.LittleEndian.PutUint64(b, j.incarnation)
	binary.LittleEndian.PutUint64(b[8:], j.lastRound)
	return b
}

func parseJoin(b []byte) (join, error) {
	if len(b) != joinSize {
		return join{}, fmt.Errorf("%w: join of %d bytes, want %d", ErrProtocol, len(b), joinSize)
	}
	return join{incarnation: binary.LittleEndian.Uint64(b), lastRound: binary.LittleEndian.Uint64(b[8:])}, nil
}

// Vectors travel as float32 little-endian.

// vecBytes returns x encoded in a new slice.
func vecBytes(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// vecInto decodes b into dst, which must hold len(b)/4 values.
func vecInto(dst []float32, b []byte) {
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
}

// vecLen returns the number of values in b, or an error if b is not a
// vector of n values.
func checkVec(b []byte, n int, what string) error {
	if len(b) != 4*n {
		return fmt.Errorf("%w: %s of %d bytes, the model has %d values (%d bytes)", ErrProtocol, what, len(b), n, 4*n)
	}
	return nil
}
