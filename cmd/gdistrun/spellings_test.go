package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parseOK parses args plus a program and fails the test on an error.
func parseOK(t *testing.T, args ...string) config {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cfg, err := parseArgs(append(args, "prog"), &stdout, &stderr)
	require.NoError(t, err, "%q: %s", args, stderr.String())
	assert.Empty(t, stderr.String())
	return cfg
}

// parseFails parses args plus a program, expects a usage error and
// returns what parseArgs wrote on stderr.
func parseFails(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	_, err := parseArgs(append(args, "prog"), &stdout, &stderr)
	require.Error(t, err, "%q", args)
	assert.Empty(t, stdout.String())
	assert.Contains(t, stderr.String(), "gdistrun -h", "%q", args)
	stderr.Reset()
	assert.Equal(t, exitUsage, mainStatus(append(args, "prog"), nil, &stdout, &stderr), "%q", args)
	return stderr.String()
}

// -np is mpirun's spelling of -n.
func TestParseArgsNp(t *testing.T) {
	assert.Equal(t, parseOK(t, "-n", "2"), parseOK(t, "-np", "2"))
	assert.Equal(t, 2, parseOK(t, "--np=2", "--nproc-per-node", "2").nproc)
	assert.Contains(t, parseFails(t, "-np", "2", "-n", "3"), "conflicts with -np=2")
}

// --nnodes takes N and torchrun's N:N; an elastic range is refused, saying
// that gdist jobs have a fixed size.
func TestParseArgsNnodesRange(t *testing.T) {
	multi := []string{"--node-rank", "1", "--rdzv-endpoint", "host0:29500"}
	want := parseOK(t, append([]string{"--nnodes", "2"}, multi...)...)
	assert.Equal(t, 2, want.nnodes)
	assert.Equal(t, want, parseOK(t, append([]string{"--nnodes", "2:2"}, multi...)...))
	assert.Equal(t, want, parseOK(t, append([]string{"--nnodes=2:2"}, multi...)...))
	assert.Equal(t, 1, parseOK(t, "--nnodes", "1:1").nnodes)
	assert.Equal(t, 1, parseOK(t).nnodes, "the default")

	msg := parseFails(t, "--nnodes", "1:4")
	assert.Contains(t, msg, `gdistrun: invalid value "1:4" for flag -nnodes: the elastic range 1:4 is not supported: gdist jobs have a fixed size`)
	assert.Contains(t, msg, "e.g. 4 or 4:4")
	assert.Contains(t, parseFails(t, "--nnodes", "two"), `want a number of nodes N (or N:N), got "two"`)
	assert.Contains(t, parseFails(t, "--nnodes", "2:x"), `want a number of nodes N (or N:N), got "2:x"`)
}

// --rdzv-backend static and c10d mean what gdist does; others are refused
// with a sentence saying why.
func TestParseArgsRdzvBackend(t *testing.T) {
	plain := parseOK(t)
	for _, args := range [][]string{
		{"--rdzv-backend", "static"}, {"--rdzv-backend=c10d"}, {"--rdzv_backend", "c10d"},
	} {
		assert.Equal(t, plain, parseOK(t, args...), "%q", args)
	}
	cfg := parseOK(t, "--nnodes", "2:2", "--node-rank", "0", "--rdzv-backend", "c10d",
		"--rdzv-endpoint", "host0:29400", "--rdzv-id", "job42", "--nproc-per-node", "2")
	assert.Equal(t, []any{2, 0, "host0", 29400, "job42", 2},
		[]any{cfg.nnodes, cfg.nodeRank, cfg.masterAddr, cfg.masterPort, cfg.runID, cfg.nproc}, "a torchrun command line")

	msg := parseFails(t, "--rdzv-backend", "etcd")
	assert.Contains(t, msg, "gdistrun: usage error: -rdzv-backend etcd is not supported: gdist has no rendezvous backends; "+
		"rank 0 hosts the rendezvous at -master-addr:-master-port, which is what static and c10d mean")
}

// --rdzv-id is accepted and reaches the ranks as TORCHELASTIC_RUN_ID;
// -log-format reaches them as GDIST_LOG_FORMAT.
func TestParseArgsRdzvIDAndLogFormat(t *testing.T) {
	assert.Equal(t, "job-7", parseOK(t, "--rdzv_id=job-7").runID)
	assert.Equal(t, "json", parseOK(t, "-log-format", "JSON").logFormat)
	assert.Equal(t, "text", parseOK(t, "--log_format=text").logFormat)
	assert.Empty(t, parseOK(t).logFormat, "none given: the environment's GDIST_LOG_FORMAT passes through")
	assert.Contains(t, parseFails(t, "-log-format", "xml"), `-log-format: log format "xml": want text or json`)
}

// --redirects and --tee take torchrun's 0-3; --redirects sends the
// streams to the -log-dir files only, and needs -log-dir.
func TestParseArgsRedirectsTee(t *testing.T) {
	for _, v := range []string{"0", "1", "2", "3"} {
		cfg := parseOK(t, "--tee", v, "--redirects", v, "--log-dir", "logs")
		assert.Equal(t, int(v[0]-'0'), cfg.tee)
		assert.Equal(t, int(v[0]-'0'), cfg.redirects)
	}
	assert.Equal(t, 3, parseOK(t, "--tee", "3").tee, "--tee alone: accepted")
	assert.Contains(t, parseFails(t, "--redirects", "3"), "--redirects 3 sends output to the -log-dir files instead of the terminal: give -log-dir DIR too")
	assert.Contains(t, parseFails(t, "--tee", "4"), `want 0 (none), 1 (stdout), 2 (stderr) or 3 (both), got "4"`)
	assert.Contains(t, parseFails(t, "--redirects", "0:1,1:2", "--log-dir", "l"), "per-rank values (0:1,1:2) are not supported")
}

// An unknown flag is named, with a suggestion where one is close, and the
// message points at -h; the program's own flags are left alone.
func TestParseArgsUnknownFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-bogus"}, "gdistrun: unknown flag -bogus\n"},
		{[]string{"--nproc-per-nod", "2"}, "gdistrun: unknown flag -nproc-per-nod (did you mean -nproc-per-node?)\n"},
		{[]string{"-n", "2", "--monitor-interval=5"}, "gdistrun: unknown flag -monitor-interval\n"},
		{[]string{"-no-prefix", "-nproc", "2"}, "gdistrun: unknown flag -nproc (did you mean -nproc-per-node?)\n"},
		{[]string{"--max-restart", "2"}, "gdistrun: unknown flag -max-restart (did you mean -max-restarts?)\n"},
	} {
		msg := parseFails(t, c.args...)
		assert.Contains(t, msg, c.want, "%q", c.args)
		assert.Contains(t, msg, "run 'gdistrun -h' for gdistrun's flags and the torchrun and mpirun spellings it takes")
		assert.NotContains(t, msg, "flag provided but not defined")
	}
	cfg := parseOK(t, "-master-addr", "-odd-host")
	assert.Equal(t, "-odd-host", cfg.masterAddr, "a flag's value is not taken for a flag")
	var out bytes.Buffer
	cfg, err := parseArgs([]string{"-n", "2", "prog", "-bogus", "--", "-x"}, &out, &out)
	require.NoError(t, err)
	assert.Equal(t, []string{"prog", "-bogus", "--", "-x"}, cfg.argv)
	cfg, err = parseArgs([]string{"-n", "2", "--", "-bogus"}, &out, &out)
	require.NoError(t, err)
	assert.Equal(t, []string{"-bogus"}, cfg.argv)
}

// -version prints the module, its version and the Go version, and exits 0.
func TestVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 0, mainStatus([]string{"-version"}, nil, &stdout, &stderr))
	assert.Empty(t, stderr.String())
	assert.Regexp(t, `^gdistrun \S+ \S+, .+, `+runtime.Version()+` `+runtime.GOOS+`/`+runtime.GOARCH+`\n$`, stdout.String())
}

func TestVersionLine(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/gdist/gdist", Version: "v0.3.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "497369b640d06787c89a6c4a2b2587899784c938"},
		{Key: "vcs.time", Value: "2026-12-01T13:00:57Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	tail := ", " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	assert.Equal(t, "gdistrun github.com/gdist/gdist v0.3.0, revision 497369b640d06787c89a6c4a2b2587899784c938 "+
		"(2026-12-01T13:00:57Z, modified)"+tail, versionLine(bi))
	bi.Settings = bi.Settings[:3]
	assert.Equal(t, "gdistrun github.com/gdist/gdist v0.3.0, revision 497369b640d06787c89a6c4a2b2587899784c938 "+
		"(2026-12-01T13:00:57Z)"+tail, versionLine(bi))
	assert.Equal(t, "gdistrun github.com/gdist/gdist (unknown), no VCS revision recorded"+tail, versionLine(nil))
}

// A gdistrun built with -buildvcs=true names the revision go build
// recorded: git's HEAD in a git checkout (go does not stamp a git
// worktree's builds; then the line says none was recorded).
func TestVersionOfBuiltBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gdistrun")
	}
	bin := filepath.Join(t.TempDir(), "gdistrun")
	build := exec.CommandContext(context.Background(), "go", "build", "-buildvcs=true", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := build.CombinedOutput()
	if err != nil && strings.Contains(string(out), "error obtaining VCS status") {
		t.Skipf("go cannot read the VCS status here: %s", out)
	}
	require.NoError(t, err, "%s", out)
	info, err := exec.Command("go", "version", "-m", bin).Output()
	require.NoError(t, err)
	out, err = exec.Command(bin, "--version").Output()
	require.NoError(t, err)
	// The version is "(devel)", or the pseudo-version go build stamps from
	// the checkout's commit (v0.0.0-<time>-<revision>).
	assert.Regexp(t, `^gdistrun github\.com/gdist/gdist (\(devel\)|v\S+), `, string(out))
	if _, rev, ok := strings.Cut(string(info), "vcs.revision="); ok {
		rev, _, _ = strings.Cut(rev, "\n")
		assert.Contains(t, string(out), "revision "+rev)
		if head, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
			assert.Equal(t, strings.TrimSpace(string(head)), rev)
		}
	} else {
		assert.Contains(t, string(out), "no VCS revision recorded")
	}
}
