//go:build linux

// Package deploy_test checks deploy/Dockerfile without a container engine:
// it builds the image's file tree with deploy/rootfs.sh (the script the
// Dockerfile's build stage runs), checks that the binaries are static, and,
// as root, runs the MNIST example from that tree alone with chroot, as the
// image's non-root user (65532), in new mount and PID namespaces (and a new
// network namespace for one rank) where unshare(1) can make them, with
// what a container runtime adds to a scratch image: /proc and the /dev
// nodes null, zero, random and urandom, and /dev/shm.
package deploy_test

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// imageUser is the Dockerfile's USER.
const imageUser = "65532:65532"

// buildRootfs runs deploy/rootfs.sh into a temporary directory and returns
// it.
func buildRootfs(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the image's binaries")
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	cmd := exec.Command("sh", "deploy/rootfs.sh", root)
	cmd.Dir = ".." // the repository root, as in the Dockerfile's WORKDIR
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "deploy/rootfs.sh:\n%s", out)
	return root
}

func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	require.NoError(t, err)
	df := string(b)
	for _, want := range []string{
		"RUN deploy/rootfs.sh /rootfs\n",                              // the tree this test builds
		"FROM scratch\n",                                              // nothing else in the image
		"COPY --from=build /rootfs/ /\n",                              // ... but that tree
		"USER " + imageUser + "\n",                                    // not root
		`ENTRYPOINT ["/usr/local/bin/mnist", "-data", "/data/mnist"]`, // the data in the image
	} {
		assert.Contains(t, df, want)
	}
}

// runtimeFiles adds to root what a container runtime provides a scratch
// image: the /dev nodes null, zero, random and urandom, /dev/shm, and a
// /proc mount point.
func runtimeFiles(t *testing.T, root string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "dev", "shm"), 0o755))
	require.NoError(t, os.Chmod(filepath.Join(root, "dev", "shm"), 0o1777))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "proc"), 0o555))
	for name, minor := range map[string]uint32{"null": 3, "zero": 5, "random": 8, "urandom": 9} {
		p := filepath.Join(root, "dev", name)
		require.NoError(t, syscall.Mknod(p, syscall.S_IFCHR|0o666, int(unix.Mkdev(1, minor))), "mknod %s", p)
		require.NoError(t, os.Chmod(p, 0o666))
	}
}

// TestRootfsRunsMNIST builds the image's tree, checks it, and runs the
// example from it.
func TestRootfsRunsMNIST(t *testing.T) {
	root := buildRootfs(t)
	for _, bin := range []string{"gdistrun", "mnist"} {
		f, err := elf.Open(filepath.Join(root, "usr/local/bin", bin))
		require.NoError(t, err)
		for _, p := range f.Progs {
			assert.NotEqual(t, elf.PT_INTERP, p.Type, "%s is static: no dynamic loader", bin)
		}
		libs, _ := f.ImportedLibraries()
		assert.Empty(t, libs, "%s needs no shared library", bin)
		f.Close()
	}
	for _, name := range []string{"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"} {
		fi, err := os.Stat(filepath.Join(root, "data/mnist", name))
		require.NoError(t, err)
		assert.Positive(t, fi.Size())
	}

	chroot, err := exec.LookPath("chroot")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("running from the tree needs root and chroot(8)")
	}
	runtimeFiles(t, root)
	// unshare(1) for fresh mount, PID and network namespaces where allowed,
	// with /proc mounted as a container runtime does (the example with one
	// rank needs no network).
	var isolate, withLoopback []string
	proc := "--mount-proc=" + filepath.Join(root, "proc")
	if u, err := exec.LookPath("unshare"); err == nil && exec.Command(u, "--mount", "--pid", "--net", "--fork", proc, "true").Run() == nil {
		isolate = []string{u, "--mount", "--pid", "--net", "--fork", proc}
		withLoopback = []string{u, "--mount", "--pid", "--fork", proc}
	}
	run := func(isolate []string, args ...string) (string, error) {
		argv := append(append(isolate, chroot, "--userspec="+imageUser, root), args...)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = []string{"TMPDIR=/tmp", "GOMAXPROCS=2"} // the image's environment: no PATH, no module cache, no Go
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		t.Logf("$ %s\n%s", strings.Join(argv, " "), out.String())
		return out.String(), err
	}

	// The image's entrypoint with one rank, a few steps, checkpoints in
	// /ckpt (written by the non-root user).
	out, err := run(isolate, "/usr/local/bin/mnist", "-data", "/data/mnist", "-epochs", "1", "-max-steps", "30",
		"-ckpt-dir", "/ckpt", "-ckpt-every", "10")
	require.NoError(t, err, out)
	assert.Contains(t, out, "epoch 1/1  loss ")
	assert.Contains(t, out, "(30 steps in ")
	assert.Contains(t, out, "parameters identical on all 1 ranks")
	ckpts, err := filepath.Glob(filepath.Join(root, "ckpt", "ckpt-*.gdc"))
	require.NoError(t, err)
	assert.NotEmpty(t, ckpts, "checkpoints written to /ckpt by user %s", imageUser)

	// Without -data the example finds no data in the image, and says so:
	// the reason the entrypoint passes -data.
	out, err = run(isolate, "/usr/local/bin/mnist", "-epochs", "1")
	require.Error(t, err)
	assert.Contains(t, out, "MNIST data not found")
	assert.Contains(t, out, "pass -data DIR")

	// Two ranks in one container under gdistrun (loopback: no --net).
	out, err = run(withLoopback, "/usr/local/bin/gdistrun", "-n", "2", "--", "/usr/local/bin/mnist", "-data", "/data/mnist",
		"-epochs", "1", "-max-steps", "20")
	require.NoError(t, err, out)
	assert.Contains(t, out, "[0] parameters identical on all 2 ranks")
}

// TestSbatch: the sbatch script bounds the job's time and gives each task
// its CPUs, which GOMAXPROCS follows.
func TestSbatch(t *testing.T) {
	b, err := os.ReadFile("slurm/mnist.sbatch")
	require.NoError(t, err)
	s := string(b)
	assert.Regexp(t, `(?m)^#SBATCH --time=[0-9]+(:[0-9]{2}){1,2}$`, s)
	assert.Regexp(t, `(?m)^#SBATCH --cpus-per-task=[1-9][0-9]*$`, s)
	assert.Contains(t, s, "GOMAXPROCS=${GOMAXPROCS:-${SLURM_CPUS_PER_TASK:-1}}")
	out, err := exec.Command("bash", "-n", "slurm/mnist.sbatch").CombinedOutput()
	require.NoError(t, err, "%s", out)
}
