// Package gdist joins a distributed job from its launcher's environment:
// InitFromEnv reads the rank, the world size and the rendezvous address
// that cmd/gdistrun, torchrun, a Kubernetes Indexed Job, Slurm or an MPI
// launcher set, picks the transport (shared memory between the ranks of a
// host, TCP between hosts, the in-process transport for a world of one),
// and returns the rank's *dist.ProcessGroup.
//
// It is the one package that knows every concrete transport: package dist
// takes any transport.Transport and imports none of them, so programs that
// bring their own transport, and tests, build a group with dist.New
// instead.
//
// # Usage
//
// Start N processes with a launcher and let each one join:
//
//	gdistrun -n 4 -- ./train
//
//	g, err := gdist.InitFromEnv(ctx)
//	if err != nil {
//		log.Fatal(err) // errors.Is(err, dist.ErrEnv) names a missing or malformed variable
//	}
//	defer g.Close()
//	if err := g.AllReduce(ctx, grad, dist.Mean); err != nil { ... }
//
// Options configure the group and the transports; options the
// environment implies (GDIST_TIMELINE, GDIST_HEARTBEAT_TIMEOUT, ...) come
// first and the caller's win:
//
//	g, err := gdist.InitFromEnv(ctx,
//		gdist.WithGroupOptions(dist.WithTimeout(10*time.Minute), dist.WithMetricsAddr(":9100")),
//		gdist.WithTCPOptions(tcp.WithSocketBuffer(4<<20)),
//		gdist.WithLogger(slog.Default()))
//
// Without a launcher the process is a world of one on the in-process
// transport, so the same program runs alone (see the example). The
// environment variables InitFromEnv reads are the Env constants below and
// the launcher variables listed at InitFromEnv.
package gdist
