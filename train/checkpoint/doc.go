// Package checkpoint reads and writes gdist checkpoints: everything a
// training run needs to resume — a model configuration (any JSON-encodable
// value), named dense tensors, optimizer state, step, epoch, sampler
// position, RNG state and user metadata — each part protected by a CRC-32C
// checksum.
//
// The format is versioned and documented byte for byte below; files of
// version 1 (configuration and tensors only) still load. [SaveState] writes
// atomically (temporary file, fsync, rename, fsync of the directory), so a
// crash never leaves a half-written checkpoint under the final name.
// [LoadSubset] reads the index and then only the tensors a filter selects,
// which is what a pipeline stage needs to load its own layers.
//
// A [Dir] keeps a run's checkpoints, ckpt-<step>.gdc: [Dir.SaveStep] verifies
// a new file completely before renaming it into place and only then removes
// the oldest beyond the newest K that verify (files that fail verification
// are renamed *.corrupt and never count; the file just saved is never
// removed), and [Dir.LoadLatest] returns the newest file
// that verifies, passing over truncated or corrupt ones and saying why. An
// [Async] writer takes a copy of the state and writes it on its own
// goroutine, so a training loop stalls only for the copy.
//
// A sharded checkpoint is a directory, ckpt-<step>/, with one such file per
// rank holding that rank's chunks of the tensors and an index (index.json,
// written last) saying which file holds which chunk: [Index], [ReadIndex],
// [WriteIndex], [Index.Read] (only the chunks that overlap what a loader
// wants), [ShardedSteps] and [PruneSharded]. dist/ckpt's SaveSharded and
// ResumeSharded write and read them across ranks.
//
// The package has no dependency on gdist's dist packages and none on any
// particular model or solver: the caller chooses the tensor names, the
// configuration type and what the optimizer's scalars and slots mean.
//
// # Usage
//
//	dir, err := checkpoint.OpenDir("ckpt", checkpoint.WithKeep(3))
//	if err != nil { ... }
//	f, found, err := dir.LoadLatest()
//	switch {
//	case errors.Is(err, checkpoint.ErrNoCheckpoint) && len(found.Skipped) == 0:
//		// a fresh run
//	case err != nil:
//		return err // every checkpoint failed verification (err says why)
//	default:
//		// resume: f.Tensor(name), f.Optimizer, f.Step, f.Epoch,
//		// sampler.UnmarshalBinary(f.Sampler), pcg.UnmarshalBinary(f.RNG)
//		// (found.Skipped lists newer files that were passed over)
//	}
//
//	w := checkpoint.NewAsync(dir)
//	defer w.Close()
//	for step := ...; ; step++ {
//		// train one step
//		if step%every == 0 {
//			pos, _ := sampler.MarshalBinary()
//			rng, _ := pcg.MarshalBinary()
//			st := &checkpoint.State{Config: cfg, Params: params, Optimizer: opt,
//				Step: step, Epoch: epoch, Sampler: pos, RNG: rng}
//			if err := w.Save(ctx, step, st); err != nil { ... } // returns after the copy
//		}
//	}
//	if err := w.Close(); err != nil { ... } // the last write
//
//	// One file, without a Dir:
//	if err := checkpoint.Save("model.gdc", cfg, params); err != nil { ... }
//	f3, err := checkpoint.LoadSubset("model.gdc", func(name string) bool {
//		return strings.HasPrefix(name, "layer03.")
//	})
//
// Errors are matchable with [errors.Is]: [ErrBadMagic], [ErrUnsupportedVersion],
// [ErrCorrupt] (truncated or malformed file; [ErrChecksum], a checksum
// mismatch, also matches ErrCorrupt), [ErrMissingTensor],
// [ErrUnsupportedDtype], [ErrInvalidArgument] (bad arguments), [ErrNoCheckpoint]
// (a Dir without a good checkpoint) and [ErrClosed]; [*SkipError] and
// [*WriteError] carry the step and unwrap to the cause.
//
// # Format (version 2)
//
// All integers are little-endian. Offsets are absolute byte offsets in the
// file.
//
//	offset     size  field
//	0          8     magic: 0x89 'G' 'D' 'C' '\r' '\n' 0x1A '\n'
//	8          4     u32 version (2)
//	12         4     u32 H: length of the header body
//	16         H     header body (below)
//	16+H       4     u32 CRC-32C (Castagnoli) of bytes [0, 16+H)
//	20+H       ...   zero padding to a multiple of 8, then tensor data
//	T          24    trailer (below), T a multiple of 8; the file ends at T+24
//
// Header body:
//
//	u32          C: length of the configuration
//	C bytes      configuration, JSON (UTF-8)
//	u32          S: length of the state record
//	S bytes      state record (below)
//	u32          N: number of tensors
//	N entries:
//	  u8         namespace: 0 parameter, 1 optimizer slot
//	  u16        name length (1..65535)
//	  bytes      name (UTF-8, unique within its namespace)
//	  u8         dtype: 1 float32, 2 float64, 3 int32, 4 int64
//	  u8         rank R (0..32)
//	  R x u64    dimensions, outermost first
//	  u64        data offset
//	  u64        data length in bytes (= product of dimensions x element size)
//	  u32        CRC-32C of the data bytes
//
// State record (maps are written with their keys in increasing byte order):
//
//	i64          step
//	i64          epoch
//	u32 + bytes  sampler position (opaque)
//	u32 + bytes  RNG state (opaque)
//	u32          M: metadata entries, each u16 key length, key, u32 value length, value
//	u8           1 if optimizer state follows, else 0; then:
//	  u16 + bytes  kind
//	  i64          iteration count
//	  u32          scalars, each u16 name length, name, f64 (IEEE 754 bits)
//	  u32          strings, each u16 name length, name, u32 value length, value
//
// Trailer:
//
//	8            end magic: 'G' 'D' 'C' 'E' 'N' 'D' '\r' '\n'
//	u64          file length (T+24)
//	u32          copy of the header CRC
//	u32          CRC-32C of the 20 trailer bytes before it
//
// Tensor data is the row-major (C order) element array, each element
// little-endian (IEEE 754 for floats, two's complement for integers).
// Parameters come first, then optimizer slots. Each tensor starts at the
// first multiple of 8 after the end of the previous one (or of the header
// checksum); a reader rejects any other offset. The padding is zero: the
// full reader ([Read], [Load]) checks it, so every flipped byte of a file is
// detected; [ReadSubset] reads neither the padding nor unselected tensors.
// The trailer ties the end of the file to its header, so a file cut anywhere
// is detected even by a reader that selects no tensor. The header body is
// limited to 64 MiB, and a reader allocates for the header and tensors only
// as their bytes arrive.
//
// A reader checks the magic, then the version (outside 1..2 is
// [ErrUnsupportedVersion], whatever follows), then the header checksum and
// structure, the trailer, and the checksum of every tensor it decodes.
//
// # Format (version 1)
//
// Version 1 files (configuration and tensors only) have the same
// preamble with version 1, a header body without the state record and
// without the namespace byte of each entry (all tensors are parameters), and
// no trailer: the file ends after the last tensor's padding. They load with
// zero step and epoch, no sampler, RNG or metadata, and a nil Optimizer.
package checkpoint
