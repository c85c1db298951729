package launch

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/gdist/gdist/internal/portpick"
)

// The environment variables a rank is started with: torchrun's names
// (package dist's Env* constants; a test checks that they agree) and gdist's
// job token.
const (
	EnvRank           = "RANK"
	EnvLocalRank      = "LOCAL_RANK"
	EnvWorldSize      = "WORLD_SIZE"
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"
	EnvMasterAddr     = "MASTER_ADDR"
	EnvMasterPort     = "MASTER_PORT"
	EnvToken          = "GDIST_TOKEN"
)

// launcherVars are the variables Spec.Env owns: any value inherited from the
// launcher's environment is dropped before the per-rank value is appended.
var launcherVars = []string{
	EnvRank, EnvLocalRank, EnvWorldSize, EnvLocalWorldSize,
	EnvMasterAddr, EnvMasterPort, EnvToken,
}

// TokenBytes is the size of a generated job token before hex encoding
// (256 bits).
const TokenBytes = 32

// NewToken returns a fresh random job token: TokenBytes bytes from
// crypto/rand, hex encoded (64 characters).
func NewToken() (string, error) {
	b := make([]byte, TokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("launch: generate job token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// FreePort picks a free TCP port on host (falling back to the loopback
// address if host cannot be bound here), below the kernel's ephemeral range
// when it can, so that no rank's outgoing connection can land on it (see
// package portpick). Another process may take the port before rank 0 binds
// it; that race is inherent to picking a port for someone else.
func FreePort(host string) (int, error) {
	port, err := portpick.Free(host)
	if err != nil {
		if port, err = portpick.Free("127.0.0.1"); err != nil {
			return 0, fmt.Errorf("launch: pick a free master port: %w", err)
		}
	}
	return port, nil
}

// Spec is what every rank of one launch shares: the job's shape, its
// rendezvous address and its token.
type Spec struct {
	NProc      int    // ranks on this node (LOCAL_WORLD_SIZE), at least 1
	NNodes     int    // nodes in the job; 0 means 1
	NodeRank   int    // this node's index in [0, NNodes)
	MasterAddr string // MASTER_ADDR; "" means 127.0.0.1
	MasterPort int    // MASTER_PORT; 0 picks a free port (single node only)
	Token      string // GDIST_TOKEN; "" generates a fresh one (single node only)
}

// nodes is NNodes with its default.
func (s Spec) nodes() int { return max(s.NNodes, 1) }

// WorldSize returns NNodes*NProc.
func (s Spec) WorldSize() int { return s.nodes() * s.NProc }

// GlobalRank returns NodeRank*NProc + localRank.
func (s Spec) GlobalRank(localRank int) int { return s.NodeRank*s.NProc + localRank }

// Env returns the environment of the rank with the given local rank: base
// (typically os.Environ()) without any of the launcher's variables, followed
// by RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT and GDIST_TOKEN. base is not modified; the caller owns the
// returned slice.
func (s Spec) Env(base []string, localRank int) []string {
	env := make([]string, 0, len(base)+len(launcherVars))
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if !isLauncherVar(name) {
			env = append(env, kv)
		}
	}
	return append(env,
		EnvRank+"="+strconv.Itoa(s.GlobalRank(localRank)),
		EnvLocalRank+"="+strconv.Itoa(localRank),
		EnvWorldSize+"="+strconv.Itoa(s.WorldSize()),
		EnvLocalWorldSize+"="+strconv.Itoa(s.NProc),
		EnvMasterAddr+"="+s.MasterAddr,
		EnvMasterPort+"="+strconv.Itoa(s.MasterPort),
		EnvToken+"="+s.Token,
	)
}

func isLauncherVar(name string) bool {
	for _, v := range launcherVars {
		if name == v {
			return true
		}
	}
	return false
}

// SpecError reports a field of a Spec out of range. It matches ErrJob.
type SpecError struct {
	Field string // the Spec field, e.g. "NProc"
	Want  string // what it must be, e.g. "at least 1"
	Value any    // what it is
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("launch: bad job: %s must be %s, got %v", e.Field, e.Want, e.Value)
}

// Unwrap returns ErrJob.
func (e *SpecError) Unwrap() error { return ErrJob }

// Resolve validates s, reporting the first field out of range as a
// *SpecError, and returns it with its defaults filled in: one node, the
// loopback address, a fresh token and a free port. Start calls it.
func (s Spec) Resolve() (Spec, error) {
	if s.NNodes == 0 {
		s.NNodes = 1
	}
	if s.MasterAddr == "" {
		s.MasterAddr = "127.0.0.1"
	}
	var bad *SpecError
	switch {
	case s.NProc < 1:
		bad = &SpecError{"NProc", "at least 1", s.NProc}
	case s.NNodes < 1:
		bad = &SpecError{"NNodes", "at least 1", s.NNodes}
	case s.NodeRank < 0 || s.NodeRank >= s.NNodes:
		bad = &SpecError{"NodeRank", fmt.Sprintf("in [0, %d)", s.NNodes), s.NodeRank}
	case s.MasterPort < 0 || s.MasterPort > 65535:
		bad = &SpecError{"MasterPort", "in [1, 65535], or 0 to pick a free one", s.MasterPort}
	case s.NNodes > 1 && s.MasterPort == 0:
		bad = &SpecError{"MasterPort", "set, the same on every node, in a multi-node job", s.MasterPort}
	case s.NNodes > 1 && s.Token == "":
		bad = &SpecError{"Token", "set, the same on every node, in a multi-node job", `""`}
	}
	if bad != nil {
		return s, bad
	}
	if s.Token == "" {
		t, err := NewToken()
		if err != nil {
			return s, err
		}
		s.Token = t
	}
	if s.MasterPort == 0 {
		p, err := FreePort(s.MasterAddr)
		if err != nil {
			return s, err
		}
		s.MasterPort = p
	}
	return s, nil
}
