// Package checkpoint reads and writes gdist model checkpoints: a model
// configuration (any JSON-encodable value) and a list of named dense tensors,
// each protected by a CRC-32C checksum.
//
// The format is versioned and documented byte for byte below. Files are
// written atomically by [Save] (temporary file, fsync, rename), so a crash
// never leaves a half-written checkpoint under the final name. [LoadSubset]
// reads the index and then only the tensors a filter selects, which is what a
// pipeline stage needs to load its own layers.
//
// The package has no dependency on gdist's dist packages and none on any
// particular model: the caller chooses the tensor names and the configuration
// type.
//
// # Usage
//
//	tensors := []checkpoint.Named{
//		{Name: "layer00.tok_emb", Tensor: emb}, // emb is a *tensor.Dense
//	}
//	if err := checkpoint.Save("model.ckpt", cfg, tensors); err != nil { ... }
//
//	f, err := checkpoint.Load("model.ckpt")
//	if err != nil { ... }
//	var cfg2 Config
//	if err := f.Config(&cfg2); err != nil { ... }
//	emb2, err := f.Tensor("layer00.tok_emb") // errors.Is(err, checkpoint.ErrMissingTensor) if absent
//
//	// Only the tensors of layer 3:
//	f3, err := checkpoint.LoadSubset("model.ckpt", func(name string) bool {
//		return strings.HasPrefix(name, "layer03.")
//	})
//
// Errors are matchable with [errors.Is]: [ErrBadMagic], [ErrUnsupportedVersion],
// [ErrCorrupt] (truncated or malformed file; [ErrChecksum], a checksum
// mismatch, also matches ErrCorrupt), [ErrMissingTensor],
// [ErrUnsupportedDtype] and [ErrInvalid] (bad arguments to [Write]).
//
// # Format (version 1)
//
// All integers are little-endian. Offsets are absolute byte offsets in the
// file.
//
//	offset     size  field
//	0          8     magic: 0x89 'G' 'D' 'C' '\r' '\n' 0x1A '\n'
//	8          4     u32 version (1)
//	12         4     u32 H: length of the header body
//	16         H     header body (below)
//	16+H       4     u32 CRC-32C (Castagnoli) of bytes [0, 16+H)
//	20+H       ...   zero padding to a multiple of 8, then tensor data
//
// Header body:
//
//	u32          C: length of the configuration
//	C bytes      configuration, JSON (UTF-8)
//	u32          N: number of tensors
//	N entries:
//	  u16        name length (1..65535)
//	  bytes      name (UTF-8, unique in the file)
//	  u8         dtype: 1 float32, 2 float64, 3 int32, 4 int64
//	  u8         rank R (0..32)
//	  R x u64    dimensions, outermost first
//	  u64        data offset
//	  u64        data length in bytes (= product of dimensions x element size)
//	  u32        CRC-32C of the data bytes
//
// Tensor data is the row-major (C order) element array, each element
// little-endian (IEEE 754 for floats, two's complement for integers). Entries
// appear in increasing offset order, data regions do not overlap, and each
// starts at a multiple of 8; the gaps are zero padding and are not covered by
// any checksum. The header body is limited to 64 MiB; a reader refuses a
// larger one before allocating it.
//
// A reader checks the magic, then the version (a different version is
// [ErrUnsupportedVersion], whatever follows), then the header checksum, and
// then the checksum of every tensor it decodes.
package checkpoint
