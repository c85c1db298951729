// Command federated trains an MLP on MNIST by federated learning (package
// dist/fed) with clients that come and go: the README's federated example.
//
// The training images are split by digit over the clients — with the default
// five, client k holds digits 2k-2 and 2k-1 and nothing else, the hardest
// split there is for federated averaging. Every process standardises the
// pixels with MNIST's usual mean and deviation (0.1307, 0.3081). Every round
// the leader (rank 0) sends the global model to the clients; each trains it
// for -local-epochs passes over its own images with SGD and reports its new
// weights and how many images it trained on; the leader averages the
// updates weighted by those counts and moves the model -server-lr times
// that average (FedAvg with a server learning rate, fed.FedAvg{LR}),
// evaluates the model on the 10,000 test images and prints the test
// accuracy and who took part. Since every client sees two digits only, each
// would pull the model towards its own; by default the example corrects that
// drift with SCAFFOLD's control variates (fed.WithScaffold, -scaffold) and
// trains the hidden layer only, the output layer staying as the leader
// initialised it (FedBABU, -train-head to train it too).
// -secagg adds secure aggregation (fed.WithSecureAggregation, on 64 bits):
// the leader learns only the sum of the updates, and the accuracy is the
// same as without it.
//
// Run alone, the program is its own launcher and supervisor: it starts the
// leader and the clients (this program again, one process per rank,
// through internal/launch), kills client -kill with SIGKILL before round
// -kill-at, and starts a new process of it before round -restart-at, which
// joins the federation again with the model of that moment. The leader's
// lines say who left and who joined. Started by a launcher (MASTER_PORT
// set: gdistrun, torchrun, Slurm, ...), it runs one rank instead.
//
// # Usage
//
//	go run ./examples/federated                    # 5 clients, 30 rounds, client 3 killed before round 5, back before round 10
//	go run ./examples/federated -secagg            # the same with secure aggregation
//	go run ./examples/federated -kill 0 -rounds 10 # nobody killed
//	go run ./examples/federated -limit 500 -rounds 5 -kill-at 2 -restart-at 3   # a quick run
//	go run ./cmd/gdistrun -n 6 -- go run ./examples/federated   # under a launcher: no supervisor
//
// Flags: -clients, -rounds, -local-epochs, -batch, -lr, -lr-decay,
// -server-lr, -hidden, -seed, -data (the MNIST IDX files; default: the
// GoMNIST module's), -limit (images per client), -secagg, -scaffold,
// -train-head, -kill, -kill-at, -restart-at, -heartbeat (the links'
// heartbeat timeout; default the transports', 10s: a killed client is seen
// at once anyway, by its closed connection, and a short timeout on a loaded
// machine takes a busy process for a frozen one).
package main
