package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gdist/gdist/internal/launch"
	"github.com/gdist/gdist/internal/logx"
)

// Configuration errors; main reports them with exit status 2.
var (
	errUsage     = errors.New("usage error")
	errNeedPort  = errors.New("-nnodes > 1 needs -master-port or -rdzv-endpoint (the same port on every host)")
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
	case cfg.nnodes < 1: // launch takes 0 for 1
		return j, fmt.Errorf("%w: -nnodes must be at least 1, got %d", errUsage, cfg.nnodes)
	case cfg.masterAddr == "": // launch takes "" for loopback
		return j, fmt.Errorf("%w: -master-addr must not be empty", errUsage)
	case cfg.timeout < 0:
		return j, fmt.Errorf("%w: -timeout must not be negative, got %v", errUsage, cfg.timeout)
	case cfg.maxRestarts < 0:
		return j, fmt.Errorf("%w: -max-restarts must not be negative, got %d", errUsage, cfg.maxRestarts)
	case cfg.killGrace < 0:
		return j, fmt.Errorf("%w: -kill-grace must not be negative, got %v", errUsage, cfg.killGrace)
	case cfg.heartbeatTimeout < 0:
		return j, fmt.Errorf("%w: -heartbeat-timeout must not be negative, got %v", errUsage, cfg.heartbeatTimeout)
	case cfg.heartbeatTimeout > 0 && cfg.heartbeatTimeout < 10*time.Millisecond:
		return j, fmt.Errorf("%w: -heartbeat-timeout must be at least 10ms, got %v", errUsage, cfg.heartbeatTimeout)
	case cfg.transport != "" && cfg.transport != "auto" && cfg.transport != "tcp" && cfg.transport != "shm":
		return j, fmt.Errorf("%w: -transport must be auto, tcp or shm, got %q", errUsage, cfg.transport)
	case cfg.bindTo != "" && cfg.bindTo != "none" && cfg.bindTo != "core":
		return j, fmt.Errorf("%w: -bind-to must be core or none, got %q", errUsage, cfg.bindTo)
	case cfg.logFormat == "" && badLogFormat(environ):
		return j, fmt.Errorf("%w: %s=%q: want text or json (or give -log-format)", errUsage, logx.EnvFormat, lookupEnv(environ, logx.EnvFormat))
	case cfg.initTimeout < 0:
		return j, fmt.Errorf("%w: -init-timeout must not be negative, got %v", errUsage, cfg.initTimeout)
	case len(cfg.argv) == 0:
		return j, fmt.Errorf("%w: %w", errUsage, errNoProgram)
	case cfg.nnodes > 1 && cfg.masterPort == 0:
		return j, fmt.Errorf("%w: %w", errUsage, errNeedPort)
	case cfg.nnodes > 1 && j.Token == "":
		return j, fmt.Errorf("%w: %w", errUsage, errNeedToken)
	}
	j, err := j.Resolve()
	var se *launch.SpecError
	if errors.As(err, &se) {
		return j, fmt.Errorf("%w: %s must be %s, got %v", errUsage, specFlags[se.Field], se.Want, se.Value)
	}
	return j, err
}

// badLogFormat reports whether environ's GDIST_LOG_FORMAT is neither text
// nor json (nor empty).
func badLogFormat(environ []string) bool {
	_, err := logx.ParseFormat(lookupEnv(environ, logx.EnvFormat))
	return err != nil
}

// specFlags names the flag that sets each launch.Spec field.
var specFlags = map[string]string{
	"NProc": "-n", "NNodes": "-nnodes", "NodeRank": "-node-rank",
	"MasterAddr": "-master-addr", "MasterPort": "-master-port", "Token": "GDIST_TOKEN",
}
