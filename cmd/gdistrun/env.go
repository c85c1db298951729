package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gdist/gdist/internal/launch"
)

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
// environment (a launch.Spec): GDIST_TOKEN is taken from environ when set there and
// generated otherwise, and a free master port is picked when
// cfg.masterPort is 0 on a single-node job.
func resolveJob(cfg config, environ []string) (launch.Spec, error) {
	j := launch.Spec{
		NProc:      cfg.nproc,
		NNodes:     cfg.nnodes,
		NodeRank:   cfg.nodeRank,
		MasterAddr: cfg.masterAddr,
		MasterPort: cfg.masterPort,
		Token:      lookupEnv(environ, launch.EnvToken),
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
		if j.Token == "" {
			return j, fmt.Errorf("%w: %w", errUsage, errNeedToken)
		}
	}
	if j.Token == "" {
		t, err := launch.NewToken()
		if err != nil {
			return j, err
		}
		j.Token = t
	}
	if j.MasterPort == 0 {
		p, err := launch.FreePort(j.MasterAddr)
		if err != nil {
			return j, err
		}
		j.MasterPort = p
	}
	return j, nil
}
