// Package fed runs federated learning: a leader holds a global model and, in
// rounds, sends it to a sample of clients, which train on their own data and
// send back new weights; the leader averages them, weighted by how many
// samples each trained on (FedAvg, McMahan et al. 2017), and moves the model
// (optionally with a server optimizer: FedAvgM, FedAdam, FedYogi,
// FedAdagrad). Clients come and go: one that dies, freezes or loses its
// network is dropped and logged, the rounds go on with the others, and it
// joins again when it comes back.
//
// Experimental: the API and the wire format (spec.md) may still change.
//
// # Why not a process group
//
// A *dist.ProcessGroup is one failure domain: a rank lost anywhere fails
// every rank, which is what a data-parallel job wants (its collectives need
// every rank) and what a federation must not do. So a federation is not a
// mode of a process group but a star of its own: the leader listens
// (tcp.Listen) and every client has one link to it (tcp.Dial), a transport
// of two ranks of its own, authenticated with the job token (and TLS 1.3
// with mutual authentication when configured), moved to shared memory when
// the client runs on the leader's host (hybrid.Over). A link that breaks
// fails nothing but itself: the leader drops the client, the client dials
// again. Clients never talk to each other, so nothing else is needed, and
// no collective exists that could hang on a missing client — the only
// operations are the leader's rounds and the clients' answers. The job
// token, the launcher's environment, the heartbeat and the refusal of
// strangers are those of package dist's transports.
//
// The leader is not replaced when it fails (no leader election): it holds
// the global model and the optimizer's state, which a replacement would have
// to get from a checkpoint anyway, so a lost leader ends the federation and
// every client says so — at once when the leader's process dies (its address
// refuses connections), after the heartbeat timeout and the reconnect
// timeout when it froze or its host vanished. A job restarted by its
// launcher resumes from the leader's checkpoint (Leader.Model, with the
// program's own checkpointing).
//
// # Membership
//
// A client is a member from its admission to the end of its link. The
// leader admits a client that joins (Join) at once between rounds and at
// the end of the current round during one, and sends it the current model.
// A member is lost when its link breaks: the process died (the leader sees
// the end of the connection at once), it froze or its network went (nothing
// heard for the heartbeat timeout), or it did not read its messages. The
// leader logs it once ("fed: client left", with the rank and the cause),
// stops waiting for its update in the round in progress, and reports it in
// the next Result's Left. A client whose link broke but whose process lives
// dials again with exponential backoff and full jitter (WithReconnect) and
// is admitted again; a new process of the same rank (a restart) joins the
// same way. One link per rank: a second process joining as a rank that is a
// member is refused (it retries, and fails with ErrRankInUse if the rank
// stays taken for the join timeout).
//
// # Rounds
//
// Leader.Round samples max(⌊fraction·n⌋, min) of the n members
// (WithFraction, WithMinClients, as Flower's fraction_fit and
// min_fit_clients; WithSeed makes it reproducible), sends them the model,
// and waits until each sampled client has reported or left, or the round
// timeout passes. It averages the updates it got, weighted by their sample
// counts, in rank order (the result does not depend on the order they
// arrived in), and steps the model with the server optimizer. Each update
// names its round: one that arrives after its round ended is dropped, never
// averaged into another. Result says who was sampled, who took part, who
// was missing, who joined and who left.
//
// With WithSecureAggregation the leader learns only the weighted sum of the
// updates, never one client's: each round runs package secagg's four stages
// over the clients' links (the key exchange while they train, the masked
// update with Report, the unmasking after the round), and a client that
// drops after masking stays in the sum. With WithScaffold the clients'
// drift is corrected with SCAFFOLD's control variates: Task.Correction, to
// add to each local gradient, and Task.Trained before Report. Both work
// together and with every server optimizer.
//
// # Usage
//
// Started by a launcher (gdistrun, torchrun, Slurm, ...), rank 0 leads and
// the others join, from the environment:
//
//	job, err := fed.FromEnv() // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GDIST_TOKEN, GDIST_TLS_*, ...
//	if err != nil {
//		log.Fatal(err)
//	}
//	if job.Rank == 0 {
//		l, err := job.Lead(ctx, model, fed.WithFraction(0.5), fed.WithServerOptimizer(&fed.FedAvgM{}))
//		if err != nil { ... }
//		defer l.Close() // clients' Next returns ErrFinished
//		for range rounds {
//			res, err := l.Round(ctx)
//			if err != nil { ... }
//			evaluate(l.Model()) // res.Reported took part; res.Left, res.Joined
//		}
//		return
//	}
//	c, err := job.Join(ctx)
//	if err != nil { ... }
//	defer c.Close()
//	for {
//		task, err := c.Next(ctx)
//		if errors.Is(err, fed.ErrFinished) {
//			return
//		}
//		if err != nil { ... } // the leader is lost: a *dist.PeerError naming rank 0
//		weights, n := train(task.Model) // local epochs from the global model
//		if err := c.Report(ctx, task, weights, n); err != nil { ... }
//	}
//
// Without a launcher, Lead("host:port", world, model, fed.WithToken(token))
// and Join("host:port", rank, world, fed.WithToken(token)) do the same (see
// the example). examples/federated trains MNIST this way, split by digit
// over five clients, one of which is killed and restarted during the run.
package fed
