// Command gdistrun launches a gdist job: N local processes, one per rank,
// with the environment torchrun and mpirun users expect.
//
// # Usage
//
//	gdistrun [flags] [--] program [args...]
//
//	gdistrun -n 4 -- ./train -epochs 3
//	gdistrun -n 2 -- go run ./examples/mnist
//
// Flags:
//
//	-n N             ranks to start on this node (alias -nproc-per-node; default 1)
//	-nnodes M        nodes (hosts) in the job, each running gdistrun (default 1)
//	-node-rank K     index of this node, 0..M-1 (default 0)
//	-master-addr A   address of the node running rank 0 (default 127.0.0.1)
//	-master-port P   rendezvous port; 0 picks a free one (single node only)
//	-no-prefix       do not prefix output lines with the rank
//	-timeout D       stop the job after D (default: no limit)
//	-kill-grace D    time between SIGTERM and SIGKILL when stopping (default 3s)
//
// Each rank gets RANK (node-rank*N + local rank), LOCAL_RANK, WORLD_SIZE
// (M*N), LOCAL_WORLD_SIZE (N), MASTER_ADDR, MASTER_PORT and GDIST_TOKEN, the
// job token ranks authenticate each other with. GDIST_TOKEN is passed
// through from gdistrun's environment when set there and is otherwise 32
// random bytes (crypto/rand) in hex, fresh for every job. Other variables
// are inherited.
//
// Every line a rank writes to stdout or stderr is prefixed with its rank,
// "[3] ", and written whole; '\r' ends a line too, so progress bars redraw
// with a prefix. A line longer than 1 MiB is written in pieces with the
// prefix before the first. With -no-prefix, ranks write straight to
// gdistrun's stdout and stderr. Stdin goes to local rank 0 when it is a pipe
// or a file, not a terminal; other ranks read /dev/null.
//
// # Failure and signals
//
// Each rank runs in a process group of its own, so a signal reaches what it
// spawned too (the program `go run` builds, for instance), and on Linux the
// kernel kills a rank if gdistrun dies. SIGINT, SIGTERM and SIGHUP are
// forwarded to every rank's group; a second one kills at once.
//
// When a rank exits non-zero or is killed by a signal, every other rank's
// group gets SIGTERM and, after -kill-grace, SIGKILL, and gdistrun exits
// with the status of that rank (128+N for signal N), printing which rank
// failed first:
//
//	gdistrun: rank 1 failed first: signal: killed
//
// Whatever a rank leaves running in its process group when it exits is
// killed. gdistrun exits 0 only when every rank exits 0; it exits 124 after
// -timeout, 128+N after receiving signal N, 127 (126) when program cannot
// be found (executed), and 2 on usage errors.
//
// # Multi-host jobs
//
// Run gdistrun on every host with the same -nnodes, -n, -master-addr,
// -master-port and GDIST_TOKEN, and the host's own -node-rank (-nnodes > 1
// requires -master-port and GDIST_TOKEN to be given explicitly):
//
//	export GDIST_TOKEN=$(openssl rand -hex 32)   # once; copy it to every host
//	# on host K (0 on HOST0):
//	GDIST_TOKEN=<same> GDIST_LISTEN_ADDR=0.0.0.0:0 \
//	  gdistrun -nnodes 2 -node-rank K -n 2 -master-addr HOST0 -master-port 29500 -- ./train
//
// Ranks listen on loopback unless GDIST_LISTEN_ADDR names an address, so
// multi-host jobs set GDIST_LISTEN_ADDR=0.0.0.0:0 (or one interface's
// address) on each host.
package main
