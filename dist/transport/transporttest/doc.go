// Package transporttest is the conformance suite every gdist transport
// passes, and Faulty, a wrapper that delays operations and cuts the wrapped
// transport (like a crash) with a seeded random source, for testing code
// that runs on top of a transport.
//
// # Usage
//
// In a transport's tests:
//
//	func TestConformance(t *testing.T) {
//		transporttest.Run(t, func(t *testing.T, n int) []transport.Transport {
//			return startMyTransports(t, n) // n connected ranks; element i has rank i
//		}, transporttest.WithLimited(func(t *testing.T, n, queueLimit int) []transport.Transport {
//			return startMyTransports(t, n, withQueueLimit(queueLimit))
//		}))
//	}
//
// Run closes the transports it gets at the end of each subtest and then
// checks that no goroutine leaked.
//
// In tests of code above the transport:
//
//	ts := transporttest.WrapAll(locals, transporttest.FaultConfig{
//		Seed: 1, DelayProb: 0.2, MaxDelay: time.Millisecond, CutAfter: 100,
//	})
package transporttest
