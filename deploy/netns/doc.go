// Package netns runs gdist jobs across real network stacks on one Linux
// machine: its test creates three network namespaces joined by a bridge
// (which sits in a fourth namespace of its own, so nothing is added to the
// host's network), gives each namespace an address in 10.231.0.0/24 and a
// rate-limited link (tc tbf on both ends of every veth), and runs one rank
// per namespace with `gdistrun -nnodes 3 -node-rank K -master-addr
// 10.231.0.1 -master-port 29500`, the way a multi-host job is started.
//
// The test checks two things:
//
//   - a pipeline run: examples/transformer generate as a 3-stage pipeline,
//     one stage per namespace, prints the very text one process generates;
//   - a link cut: examples/mnist trains with DDP for an epoch and a quarter
//     (390 steps of 3x64 images), then one namespace's link is set down
//     (`ip link set eth0 down` inside it) in the middle of the run. Every
//     surviving rank must fail with an error that names the cut rank as its
//     culprit ("peer rank N" or "rank N failed") and no other, within the
//     heartbeat timeout (GDIST_HEARTBEAT_TIMEOUT=3s) plus 1 s, and its
//     gdistrun must exit non-zero.
//     The detection time after the cut is logged. (The ranks are other
//     processes: the error text gdistrun relays is all the test can see.)
//
// The namespaces cannot reach any address outside 10.231.0.0/24: they have
// no default route and no link to the host's namespace. Every namespace the
// test makes (and with it every veth and the bridge) is removed when it
// ends, also when it fails; namespaces left behind by a test process that
// was killed are removed by the next run. The test skips, saying why, when
// it does not run as root, when `ip` or `tc` is missing, when namespaces
// cannot be created, and under -short.
//
// # Usage
//
// As root, from the repository root (it builds cmd/gdistrun, examples/mnist
// and examples/transformer first):
//
//	go test ./deploy/netns -v -run TestMultiHost
//	go test ./deploy/netns -v -run TestMultiHost -args -netns.long -netns.rate 100mbit -netns.cut 1
//
// -netns.long trains three epochs and cuts the link in the third, and
// generates 400 characters instead of 80; -netns.rate sets the tbf rate of
// every link (default 400mbit); -netns.cut the rank whose link is cut (1 or
// 2; rank 0 is the rendezvous host). The default run takes about a minute
// plus the heartbeat timeout.
package netns
