// Package ring is the shared-memory layout of package shm: a region holding
// two single-producer/single-consumer byte rings (one per direction of a
// pair of ranks), their control blocks and the doorbells the two processes
// park on (Linux only). See ../../spec.md for the layout.
//
// Everything read from the region is treated as untrusted: the other
// process can write any byte of it at any time. Producer and Consumer keep
// their own indices in private memory, read the other side's index once,
// check it (monotone, never more than a ring apart) and only then use it,
// and every access to the data area is masked to the ring's size, so a
// scribbling peer causes an error wrapping ErrCorrupt, never an
// out-of-bounds access.
package ring
