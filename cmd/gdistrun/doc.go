// Command gdistrun launches a gdist job: N local processes, one per rank,
// with the environment torchrun and mpirun users expect.
//
// # Usage
//
//	gdistrun [flags] [--] program [args...]
//
//	gdistrun -n 4 -- ./train -epochs 3
//	gdistrun --standalone --nproc-per-node 2 ./train   # torchrun's spelling
//	gdistrun -n 2 -- go run ./examples/mnist
//	gdistrun -n 2 -max-restarts 3 -log-dir logs -- ./train -resume
//
// Flags (one dash or two; torchrun's spellings after the first):
//
//	-n N             ranks to start on this node (-nproc-per-node,
//	                 -nproc_per_node; default 1)
//	-nnodes M        nodes (hosts) in the job, each running gdistrun (default 1)
//	-node-rank K     index of this node, 0..M-1 (-node_rank; default 0)
//	-master-addr A   address of the node running rank 0 (-master_addr;
//	                 default 127.0.0.1)
//	-master-port P   rendezvous port; 0 picks a free one, single node only
//	                 (-master_port)
//	-rdzv-endpoint A:P  sets -master-addr A and -master-port P (-rdzv_endpoint)
//	-standalone      a single node on a free port: gdistrun's default
//	-max-restarts N  restart the whole job up to N times when a rank fails
//	                 (-max_restarts; default 0)
//	-log-dir DIR     also write each rank's output to DIR/rank<R>.log (-log_dir)
//	-no-prefix       do not prefix output lines with the rank
//	-timeout D       stop the job after D, restarts included (default: no limit)
//	-kill-grace D    time between SIGTERM and SIGKILL when stopping (default 3s)
//	-heartbeat-timeout D  report a rank that stops responding after D
//	                 (-heartbeat_timeout; sets GDIST_HEARTBEAT_TIMEOUT for the
//	                 ranks; default: gdist's, 10s)
//	-init-timeout D  fail the rendezvous after D, naming the ranks that never
//	                 joined (-init_timeout; sets GDIST_INIT_TIMEOUT; default:
//	                 gdist's, 5m)
//	-transport M     how ranks on one host talk: auto, tcp or shm (sets
//	                 GDIST_TRANSPORT; default: gdist's, auto: shared memory
//	                 between the ranks of a host where it sets up, TCP
//	                 otherwise and between hosts)
//	-bind-to B       core: bind each rank to one CPU, local rank i to the
//	                 i-th CPU gdistrun may use, wrapping around when there are
//	                 more ranks than CPUs (-bind_to; Linux; Open MPI's
//	                 --bind-to core); none (default): the kernel places them
//
// Two spellings of one flag with different values (-n 2 --nproc_per_node 3),
// -rdzv-endpoint with a different -master-addr or -master-port, and
// -standalone with -nnodes > 1, a master address or port are usage errors.
// `gdistrun -h` lists every flag once with all its spellings.
//
// Each rank gets RANK (node-rank*N + local rank), LOCAL_RANK, WORLD_SIZE
// (M*N), LOCAL_WORLD_SIZE (N), MASTER_ADDR, MASTER_PORT, GDIST_TOKEN (the
// job token ranks authenticate each other with) and GDIST_RESTART_COUNT (0,
// then 1, 2, ... after each restart); with -transport also GDIST_TRANSPORT.
// GDIST_TOKEN is passed through from
// gdistrun's environment when set there and is otherwise 32 random bytes
// (crypto/rand) in hex, fresh for every job and every restart. Other
// variables are inherited.
//
// Unless GOMAXPROCS is set in gdistrun's environment, each rank gets
// GOMAXPROCS = max(1, CPUs/N), CPUs being what Go's runtime gives gdistrun
// by default (the CPUs it may run on, capped by a cgroup CPU limit), so
// that N ranks do not oversubscribe the machine (torchrun sets
// OMP_NUM_THREADS=1 for the same reason). gdistrun prints its choice once:
//
//	gdistrun: GOMAXPROCS=1 for each of 2 ranks (2 CPUs; set GOMAXPROCS to override)
//
// Every line a rank writes to stdout or stderr is prefixed with its rank,
// "[3] ", and written whole; '\r' ends a line too, so progress bars redraw
// with a prefix. A line longer than 1 MiB is written in pieces with the
// prefix before the first. With -no-prefix, ranks write straight to
// gdistrun's stdout and stderr. Stdin goes to local rank 0 when it is a pipe
// or a file, not a terminal; other ranks read /dev/null.
//
// With -log-dir DIR (created if need be), each rank's stdout and stderr
// also go, line by line and unprefixed, to DIR/rank<R>.log, R the global
// rank; the terminal output is unchanged. The files are appended to, across
// restarts and runs, and every attempt starts with a header line and ends
// with how the rank ended:
//
//	=== gdistrun 2026-12-01T06:38:50Z: rank 1, attempt 1 of 3 (GDIST_RESTART_COUNT=0): ./train -resume
//	...
//	=== gdistrun: rank 1 ended: exit status 3
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
// # Restarts
//
// With -max-restarts N (torchrun's name and meaning), once a failed job's
// ranks have all been stopped, gdistrun starts them all again, up to N
// times, with a fresh rendezvous (a new free master port on a single node;
// the same -master-port across nodes) and a fresh token (unless GDIST_TOKEN
// was given: other nodes share it), and says why:
//
//	gdistrun: rank 1 failed (signal: killed); restart 1 of 2
//
// A program resumes from its own checkpoint; GDIST_RESTART_COUNT tells it
// which attempt it is. When the restarts run out, gdistrun exits with the
// status of the rank that failed first in the last attempt:
//
//	gdistrun: rank 1 failed first: signal: killed (attempt 3 of 3)
//
// A signal to gdistrun, even while a failed attempt is being stopped, and
// -timeout end the job without a restart. A program that cannot be started
// is not retried. In a multi-node job each node's gdistrun restarts its own
// ranks only: when a rank dies, its peers on the other nodes lose their
// link to it (a closed connection, or gdist's heartbeat timeout for a host
// that went silent), and when the program exits on that error their
// gdistrun restarts them as well; every node then rendezvouses again on
// -master-port. Give every node the same -max-restarts.
//
// # Multi-host jobs
//
// Run gdistrun on every host with the same -nnodes, -n, -master-addr,
// -master-port and GDIST_TOKEN, and the host's own -node-rank (-nnodes > 1
// requires -master-port or -rdzv-endpoint, and GDIST_TOKEN, to be given
// explicitly):
//
//	export GDIST_TOKEN=$(openssl rand -hex 32)   # once; copy it to every host
//	# on host K (0 on HOST0):
//	GDIST_TOKEN=<same> gdistrun -nnodes 2 -node-rank K -n 2 -master-addr HOST0 -master-port 29500 -- ./train
//	# or, as with torchrun:
//	GDIST_TOKEN=<same> gdistrun --nnodes 2 --node-rank K --nproc-per-node 2 --rdzv-endpoint HOST0:29500 ./train
//
// With -nnodes > 1, gdistrun sets GDIST_LISTEN_ADDR=0.0.0.0:0 for the ranks
// unless it is set already, so they listen on all interfaces (gdist's TCP
// transport advertises the address that reaches rank 0); set it to one
// interface's address (e.g. 10.0.0.5:0) to listen there only. On a single
// node ranks listen on loopback.
package main
