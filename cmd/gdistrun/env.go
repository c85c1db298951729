package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gdist/gdist/internal/portpick"
)

// Environment variables the launcher sets for every child.
const (
	envRank           = "RANK"
	envLocalRank      = "LOCAL_RANK"
	envWorldSize      = "WORLD_SIZE"
	envLocalWorldSize = "LOCAL_WORLD_SIZE"
	envMasterAddr     = "MASTER_ADDR"
	envMasterPort     = "MASTER_PORT"
	envToken          = "GDIST_TOKEN"
)

// launcherVars are the variables rankEnv owns: any value inherited from the
// launcher's environment is dropped before the per-rank value is appended.
var launcherVars = []string{
	envRank, envLocalRank, envWorldSize, envLocalWorldSize,
	envMasterAddr, envMasterPort, envToken,
}

// tokenBytes is the size of a generated job token before hex encoding.
const tokenBytes = 32

// newToken returns a fresh random job token: 32 bytes from crypto/rand,
// hex encoded (64 characters).
func newToken() (string, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate job token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// freePort picks a free TCP port on host (falling back to the loopback
// address if host cannot be bound here), below the kernel's ephemeral range
// when it can, so that no rank's outgoing connection can land on it (see
// package portpick). Another process may take the port before rank 0 binds
// it; that race is inherent to picking a port for someone else.
func freePort(host string) (int, error) {
	port, err := portpick.Free(host)
	if err != nil {
		if port, err = portpick.Free("127.0.0.1"); err != nil {
			return 0, fmt.Errorf("pick a free master port: %w", err)
		}
	}
	return port, nil
}

// jobEnv holds what every rank of one launcher invocation shares.
type jobEnv struct {
	nproc      int    // ranks on this node (LOCAL_WORLD_SIZE)
	nnodes     int    // nodes in the job
	nodeRank   int    // this node's index in [0, nnodes)
	masterAddr string // MASTER_ADDR
	masterPort int    // MASTER_PORT
	token      string // GDIST_TOKEN
}

// worldSize returns nnodes*nproc.
func (j jobEnv) worldSize() int { return j.nnodes * j.nproc }

// globalRank returns nodeRank*nproc + localRank.
func (j jobEnv) globalRank(localRank int) int { return j.nodeRank*j.nproc + localRank }

// rankEnv returns the environment of the child with the given local rank:
// base (typically os.Environ()) without any of the launcher's variables,
// followed by RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT and GDIST_TOKEN. base is not modified; the caller owns the
// returned slice.
func rankEnv(base []string, j jobEnv, localRank int) []string {
	env := make([]string, 0, len(base)+len(launcherVars))
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if !isLauncherVar(name) {
			env = append(env, kv)
		}
	}
	return append(env,
		envRank+"="+strconv.Itoa(j.globalRank(localRank)),
		envLocalRank+"="+strconv.Itoa(localRank),
		envWorldSize+"="+strconv.Itoa(j.worldSize()),
		envLocalWorldSize+"="+strconv.Itoa(j.nproc),
		envMasterAddr+"="+j.masterAddr,
		envMasterPort+"="+strconv.Itoa(j.masterPort),
		envToken+"="+j.token,
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

// Configuration errors; main reports them with exit status 2.
var (
	errUsage     = errors.New("usage error")
	errNeedPort  = errors.New("-nnodes > 1 needs -master-port (the same port on every host)")
	errNeedToken = errors.New("-nnodes > 1 needs GDIST_TOKEN in the environment, the same on every host (e.g. export GDIST_TOKEN=$(openssl rand -hex 32))")
	errNoProgram = errors.New("no program given (usage: gdistrun -n N [flags] -- program [args...])")
)

// lookupEnv returns the value of the last name=value entry in environ, or "".
func lookupEnv(environ []string, name string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(environ[i], "="); ok && k == name {
			return v
		}
	}
	return ""
}

// resolveJob validates the flag values in cfg and fills in the job-wide
// environment: GDIST_TOKEN is taken from environ when set there and
// generated otherwise, and a free master port is picked when
// cfg.masterPort is 0 on a single-node job.
func resolveJob(cfg config, environ []string) (jobEnv, error) {
	j := jobEnv{
		nproc:      cfg.nproc,
		nnodes:     cfg.nnodes,
		nodeRank:   cfg.nodeRank,
		masterAddr: cfg.masterAddr,
		masterPort: cfg.masterPort,
		token:      lookupEnv(environ, envToken),
	}
	switch {
	case cfg.nproc < 1:
		return j, fmt.Errorf("%w: -n must be at least 1, got %d", errUsage, cfg.nproc)
	case cfg.nnodes < 1:
		return j, fmt.Errorf("%w: -nnodes must be at least 1, got %d", errUsage, cfg.nnodes)
	case cfg.nodeRank < 0 || cfg.nodeRank >= cfg.nnodes:
		return j, fmt.Errorf("%w: -node-rank must be in [0, %d), got %d", errUsage, cfg.nnodes, cfg.nodeRank)
	case cfg.masterPort < 0 || cfg.masterPort > 65535:
		return j, fmt.Errorf("%w: -master-port must be in [1, 65535], got %d", errUsage, cfg.masterPort)
	case cfg.masterAddr == "":
		return j, fmt.Errorf("%w: -master-addr must not be empty", errUsage)
	case cfg.timeout < 0:
		return j, fmt.Errorf("%w: -timeout must not be negative, got %v", errUsage, cfg.timeout)
	case cfg.killGrace < 0:
		return j, fmt.Errorf("%w: -kill-grace must not be negative, got %v", errUsage, cfg.killGrace)
	case len(cfg.argv) == 0:
		return j, fmt.Errorf("%w: %w", errUsage, errNoProgram)
	}
	if cfg.nnodes > 1 {
		if cfg.masterPort == 0 {
			return j, fmt.Errorf("%w: %w", errUsage, errNeedPort)
		}
		if j.token == "" {
			return j, fmt.Errorf("%w: %w", errUsage, errNeedToken)
		}
	}
	if j.token == "" {
		t, err := newToken()
		if err != nil {
			return j, err
		}
		j.token = t
	}
	if j.masterPort == 0 {
		p, err := freePort(j.masterAddr)
		if err != nil {
			return j, err
		}
		j.masterPort = p
	}
	return j, nil
}
