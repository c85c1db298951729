// Package launch starts the N rank processes of a gdist job on this machine,
// the way torchrun does, and supervises them. It is the one launcher of the
// repository: cmd/gdistrun, the programs under bench/ and examples/ that
// start their own ranks, and the multi-process tests (through
// internal/procjob) all start ranks with it. It does not import package
// dist.
//
// Every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// MASTER_ADDR (127.0.0.1 unless set), MASTER_PORT (a free port below the
// kernel's ephemeral range, see package portpick, unless set) and
// GDIST_TOKEN (a fresh 256-bit random token for every launch unless set),
// with any values inherited from the launcher's environment dropped; then
// GOMAXPROCS if Job.Procs is set, Job.Env and Job.RankEnv(rank).
//
// Each rank runs in a process group of its own, so a signal reaches what it
// spawned too, and on Linux the kernel kills a rank if the launcher dies.
// The first rank that fails stops the job (SIGTERM to every other rank's
// group, SIGKILL after Job.KillGrace) and Wait reports it as a *RankError;
// so do the end of the context given to Start and a signal on Job.Signals.
// Whatever a rank leaves running in its process group when it exits is
// killed. Output goes wherever Job.Output says per rank: the launcher's
// files, "[rank] "-prefixed lines (Prefixed), a function per line
// (LineFunc) or any writer.
//
// # Usage
//
// Re-executing the running program as 4 ranks with GOMAXPROCS=1, output
// prefixed by rank; the ranks tell themselves apart by an extra variable and
// join with gdist.InitFromEnv:
//
//	if os.Getenv("MYPROG_RANK") != "" {
//		return runRank(ctx) // gdist.InitFromEnv(ctx) ...
//	}
//	r, err := launch.Start(ctx, launch.Job{
//		Spec:   launch.Spec{NProc: 4},
//		Args:   os.Args[1:],
//		Env:    []string{"MYPROG_RANK=1"},
//		Procs:  1,
//		Output: launch.Prefixed(os.Stdout, os.Stderr),
//	})
//	if err != nil {
//		return err
//	}
//	var re *launch.RankError
//	if err := r.Wait(); errors.As(err, &re) {
//		// re.Rank failed first; the others were stopped.
//	}
package launch
