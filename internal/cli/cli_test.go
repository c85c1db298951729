package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestExitCode(t *testing.T) {
	errUsage := errors.New("prog: usage")
	var buf bytes.Buffer
	assert.Equal(t, 0, ExitCode("prog", errUsage, nil, &buf))
	assert.Equal(t, 0, ExitCode("prog", errUsage, flag.ErrHelp, &buf))
	assert.Equal(t, 2, ExitCode("prog", errUsage, fmt.Errorf("x: %w", errUsage), &buf))
	assert.Empty(t, buf.String())
	assert.Equal(t, 1, ExitCode("prog", errUsage, errors.New("boom"), &buf))
	assert.Equal(t, "prog: error: boom\n", buf.String())
}

func TestParse(t *testing.T) {
	errUsage := errors.New("prog: usage")
	newFS := func(out *bytes.Buffer) *flag.FlagSet {
		fs := flag.NewFlagSet("prog", flag.ContinueOnError)
		fs.SetOutput(out)
		fs.Int("n", 1, "how many")
		return fs
	}
	for _, h := range []string{"-h", "-help", "--help"} {
		var out bytes.Buffer
		err := Parse(newFS(&out), []string{h}, errUsage)
		assert.ErrorIs(t, err, flag.ErrHelp, h)
		assert.Equal(t, 0, ExitCode("prog", errUsage, err, &out), h)
		assert.Contains(t, out.String(), "-n int", "%s prints the usage", h)
	}
	for _, bad := range [][]string{{"-x"}, {"-n", "many"}, {"extra"}} {
		var out bytes.Buffer
		err := Parse(newFS(&out), bad, errUsage)
		assert.ErrorIs(t, err, errUsage, "%q", bad)
		assert.Equal(t, 2, ExitCode("prog", errUsage, err, &out), "%q", bad)
		assert.Contains(t, out.String(), "-n int", "%q prints the usage", bad)
	}
	var out bytes.Buffer
	assert.NoError(t, Parse(newFS(&out), []string{"-n", "3"}, errUsage))
	assert.Empty(t, out.String())
}

func TestUsagef(t *testing.T) {
	errUsage := errors.New("prog: usage")
	var out bytes.Buffer
	fs := flag.NewFlagSet("prog", flag.ContinueOnError)
	fs.SetOutput(&out)
	fs.Int("n", 1, "how many")
	err := Usagef(fs, errUsage, "-n %d is too many", 7)
	assert.ErrorIs(t, err, errUsage)
	assert.Contains(t, out.String(), "prog: -n 7 is too many\n")
	assert.Contains(t, out.String(), "-n int")
}

type closer struct{ err error }

func (c closer) Close() error { return c.err }

func TestClose(t *testing.T) {
	errClose, errRun := errors.New("close failed"), errors.New("run failed")
	run := func(runErr, closeErr error) (err error) {
		defer Close(&err, closer{closeErr})
		return runErr
	}
	assert.Equal(t, errClose, run(nil, errClose), "Close's error is not lost")
	assert.Equal(t, errRun, run(errRun, errClose), "the first error wins")
	assert.NoError(t, run(nil, nil))
}
