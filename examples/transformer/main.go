package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"

	"github.com/gdist/gdist/internal/cli"
)

func main() { cli.Main("transformer", errUsage, run) }

// errUsage reports bad command-line arguments (already printed).
var errUsage = errors.New("transformer: usage")

// graphMu serialises Gorgonia graph construction, which touches package
// globals: the tests run several ranks in one process. Every graph this
// program builds (NewTrainer included) is built under it.
var graphMu sync.Mutex

const usage = `Usage: [gdistrun -n N --] transformer <command> [flags]

A character-level transformer trained on Newton's Opticks.

Commands:
  train      train a model (data-parallel under gdistrun) and save a checkpoint
  generate   generate text from a checkpoint (pipeline-parallel under gdistrun)
  convert    convert a model between gdist's checkpoint format and safetensors

Run "transformer <command> -h" for the flags of a command.
`

// run is the whole program: args are the command-line arguments without
// the program name.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	switch args[0] {
	case "train":
		return runTrain(ctx, args[1:], stdout, stderr)
	case "generate":
		return runGenerate(ctx, args[1:], stdout, stderr)
	case "convert":
		return runConvert(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "transformer: unknown command %q\n\n%s", args[0], usage)
	return errUsage
}

// parseFlags parses args with fs and rejects positional arguments.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "transformer %s: unexpected arguments %q\n", fs.Name(), fs.Args())
		fs.Usage()
		return errUsage
	}
	return nil
}

// usageError prints msg and the flags of fs and returns errUsage.
func usageError(fs *flag.FlagSet, stderr io.Writer, format string, a ...any) error {
	fmt.Fprintf(stderr, "transformer %s: %s\n", fs.Name(), fmt.Sprintf(format, a...))
	fs.Usage()
	return errUsage
}
