package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"time"

	"github.com/gdist/gdist/internal/cli"
	"github.com/gdist/gdist/internal/launchenv"
)

// config is the example's flags.
type config struct {
	Clients     int     // clients (ranks 1 to Clients; rank 0 leads)
	Rounds      int     // federated rounds
	LocalEpochs int     // passes over a client's data per round
	Batch       int     // local mini-batch
	LR          float64 // local learning rate
	LRDecay     float64 // ... times this per round
	ServerLR    float64 // the leader's step: this times the clients' average update
	Hidden      int     // hidden units of the MLP
	Seed        int64
	Data        string // directory of the MNIST IDX files ("" finds the GoMNIST module)
	Limit       int    // use at most this many training images per client (0: all)
	Secure      bool   // secure aggregation
	Scaffold    bool   // SCAFFOLD drift correction
	TrainHead   bool   // train the output layer locally too (else FedBABU: the body only)
	KillClient  int    // the client the supervisor kills (0: none)
	KillAt      int    // ... before this round
	RestartAt   int    // ... and restarts before this round (0: never)
	Heartbeat   time.Duration
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("federated", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&c.Clients, "clients", 5, "number of clients; with -split digits each holds 10/clients digits")
	fs.IntVar(&c.Rounds, "rounds", 30, "federated rounds")
	fs.IntVar(&c.LocalEpochs, "local-epochs", 1, "passes over a client's data per round")
	fs.IntVar(&c.Batch, "batch", 256, "local mini-batch size")
	fs.Float64Var(&c.LR, "lr", 0.2, "local SGD learning rate in round 1")
	fs.Float64Var(&c.LRDecay, "lr-decay", 1, "factor of the learning rate from one round to the next")
	fs.Float64Var(&c.ServerLR, "server-lr", 1.5, "server learning rate: the model moves this times the clients' average update (FedAvg{LR})")
	fs.IntVar(&c.Hidden, "hidden", 200, "hidden units of the 784-H-10 MLP")
	fs.Int64Var(&c.Seed, "seed", 1, "seed of the initial model and the local shuffles")
	fs.StringVar(&c.Data, "data", "", "directory of the MNIST IDX files (default: the GoMNIST module's)")
	fs.IntVar(&c.Limit, "limit", 0, "use at most this many training images per client (0: all)")
	fs.BoolVar(&c.Secure, "secagg", false, "secure aggregation: the leader learns only the sum of the updates")
	fs.BoolVar(&c.Scaffold, "scaffold", true, "correct the clients' drift with SCAFFOLD's control variates")
	fs.BoolVar(&c.TrainHead, "train-head", false, "train the output layer locally too (default: only the hidden layer, FedBABU)")
	fs.IntVar(&c.KillClient, "kill", 3, "the client the supervisor kills with SIGKILL (0: none)")
	fs.IntVar(&c.KillAt, "kill-at", 5, "kill it before this round")
	fs.IntVar(&c.RestartAt, "restart-at", 10, "start it again before this round (0: never)")
	fs.DurationVar(&c.Heartbeat, "heartbeat", 0, "the links' heartbeat timeout (0: the transports' default, 10s)")
	if err := cli.Parse(fs, args, errUsage); err != nil {
		return c, err
	}
	bad := func(format string, a ...any) (config, error) { return c, cli.Usagef(fs, errUsage, format, a...) }
	switch {
	case c.Clients < 2 || c.Clients > 10:
		return bad("-clients %d: between 2 and 10 (each holds at least one digit)", c.Clients)
	case c.Rounds < 1, c.LocalEpochs < 1, c.Batch < 1, c.LR <= 0, c.ServerLR <= 0, c.Hidden < 1, c.Limit < 0, c.LRDecay <= 0 || c.LRDecay > 1:
		return bad("-rounds, -local-epochs, -batch, -lr, -server-lr and -hidden must be positive, -limit not negative, -lr-decay in (0, 1]")
	case c.KillClient < 0 || c.KillClient > c.Clients:
		return bad("-kill %d: a client is 1 to %d", c.KillClient, c.Clients)
	case c.KillClient > 0 && (c.KillAt < 2 || c.KillAt > c.Rounds):
		return bad("-kill-at %d: a round from 2 to %d", c.KillAt, c.Rounds)
	case c.KillClient > 0 && c.RestartAt != 0 && (c.RestartAt <= c.KillAt || c.RestartAt > c.Rounds):
		return bad("-restart-at %d: a round after -kill-at %d, at most %d", c.RestartAt, c.KillAt, c.Rounds)
	}
	return c, nil
}

var errUsage = errors.New("federated: usage")

func main() { cli.Main("federated", errUsage, run) }

// run starts the job (supervise) or, started by a launcher (MASTER_PORT
// set), runs one rank of it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if _, ok := os.LookupEnv(launchenv.EnvMasterPort); ok {
		return runRank(ctx, cfg, stdout)
	}
	return supervise(ctx, cfg, args, stdout, stderr)
}
