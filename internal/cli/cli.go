// Package cli holds the main() boilerplate the programs under examples/ and
// bench/ share: a context cancelled by SIGINT or SIGTERM, flag parsing and
// exit codes (0 for -h and -help, 2 for bad usage, 1 for any other error,
// printed as "<name>: error: ...") and the per-rank GOMAXPROCS share.
//
// # Usage
//
//	var errUsage = errors.New("prog: usage")
//
//	func main() { cli.Main("prog", errUsage, run) }
//
//	func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
//		fs := flag.NewFlagSet("prog", flag.ContinueOnError)
//		fs.SetOutput(stderr)
//		n := fs.Int("n", 1, "how many")
//		if err := cli.Parse(fs, args, errUsage); err != nil {
//			return err // flag.ErrHelp (exit 0) or errUsage (exit 2)
//		}
//		cli.SetProcs()
//		pg, err := gdist.InitFromEnv(ctx)
//		...
//		defer cli.Close(&err, pg) // run's result is (err error)
//	}
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
)

// Parse parses args with fs (which must use flag.ContinueOnError) and
// returns nil, an error matching flag.ErrHelp for -h and -help (fs has
// printed the usage), or one matching errUsage for a bad flag (fs has
// printed why) or a positional argument (Parse prints it and the usage).
// With Main, -h exits 0 and bad usage 2.
func Parse(fs *flag.FlagSet, args []string, errUsage error) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		fs.Usage()
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	return nil
}

// Usagef prints "name: message" and the usage of fs to fs.Output() and
// returns an error matching errUsage: for flag values that parse but make
// no sense.
func Usagef(fs *flag.FlagSet, errUsage error, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	fmt.Fprintf(fs.Output(), "%s: %s\n", fs.Name(), msg)
	fs.Usage()
	return fmt.Errorf("%w: %s", errUsage, msg)
}

// RunFunc is a whole program: args are the command-line arguments without
// the program name.
type RunFunc func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// Main runs run with os.Args[1:], stdout and stderr under a context that
// SIGINT and SIGTERM cancel, and exits: 0 when run returns nil or an error
// matching flag.ErrHelp, 2 when it matches errUsage (the usage is already
// printed), and 1 after printing "name: error: err" to stderr otherwise.
func Main(name string, errUsage error, run RunFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(ExitCode(name, errUsage, err, os.Stderr))
}

// ExitCode is Main's exit code for err, printing a failure to stderr.
func ExitCode(name string, errUsage, err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintln(stderr, name+": error:", err)
		return 1
	}
}

// Close closes c and, if *err is nil, sets it to the error Close returns:
// for a deferred Close whose error must not be lost, such as a process
// group's, which writes the timeline (GDIST_TIMELINE) and fails if it
// cannot. In a function with a named error result:
//
//	pg, err := gdist.InitFromEnv(ctx)
//	if err != nil {
//		return err
//	}
//	defer cli.Close(&err, pg)
func Close(err *error, c io.Closer) {
	if cerr := c.Close(); cerr != nil && *err == nil {
		*err = cerr
	}
}

// SetProcs gives each of the ranks on this machine an equal share of the
// CPUs, like torchrun's OMP_NUM_THREADS, unless GOMAXPROCS is set: with
// LOCAL_WORLD_SIZE n >= 2 it sets GOMAXPROCS to max(1, NumCPU/n).
func SetProcs() {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	local, err := strconv.Atoi(os.Getenv("LOCAL_WORLD_SIZE"))
	if err != nil || local < 2 {
		return
	}
	runtime.GOMAXPROCS(max(1, runtime.NumCPU()/local))
}
