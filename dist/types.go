package dist

import (
	"fmt"
	"math"
)

// DType is the element type of a Buffer. The zero value is not a valid
// DType.
type DType uint8

// The element types. Buffers hold them little-endian, and collectives
// carry them on the wire in their own width.
const (
	Float16  DType = iota + 1 // IEEE 754 binary16 (github.com/x448/float16)
	BFloat16                  // bfloat16: the top 16 bits of a float32, rounded to nearest even
	Float32                   // IEEE 754 binary32
	Float64                   // IEEE 754 binary64
)

// Size returns the size of one element in bytes, or 0 for an invalid DType.
func (d DType) Size() int {
	switch d {
	case Float16, BFloat16:
		return 2
	case Float32:
		return 4
	case Float64:
		return 8
	}
	return 0
}

// String returns "f16", "bf16", "f32" or "f64".
func (d DType) String() string {
	switch d {
	case Float16:
		return "f16"
	case BFloat16:
		return "bf16"
	case Float32:
		return "f32"
	case Float64:
		return "f64"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

func (d DType) valid() bool { return d.Size() != 0 }

// ReduceOp is how a reduction combines the ranks' values element by element.
// The zero value is Sum.
type ReduceOp uint8

// The reductions. Mean is Sum followed by a division by the world size.
const (
	Sum ReduceOp = iota
	Mean
	Max
	Min
	Prod
)

// String returns "sum", "mean", "max", "min" or "prod".
func (o ReduceOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Mean:
		return "mean"
	case Max:
		return "max"
	case Min:
		return "min"
	case Prod:
		return "prod"
	}
	return fmt.Sprintf("reduce_op(%d)", uint8(o))
}

func (o ReduceOp) valid() bool { return o <= Prod }

// opKind identifies a collective in fingerprints and errors.
type opKind uint8

const (
	kAllReduce opKind = iota + 1
	kAllGather
	kReduceScatter
	kBroadcast
	kReduce
	kBarrier
	kFederated
	kAllGatherV
	kAllToAll
	kAllToAllV
	kGather
	kScatter
	kNewGroup
	kSplit
)

var opNames = [...]string{
	kAllReduce:     "all_reduce",
	kAllGather:     "all_gather",
	kReduceScatter: "reduce_scatter",
	kBroadcast:     "broadcast",
	kReduce:        "reduce",
	kBarrier:       "barrier",
	kFederated:     "federated_average",
	kAllGatherV:    "all_gather_v",
	kAllToAll:      "all_to_all",
	kAllToAllV:     "all_to_all_v",
	kGather:        "gather",
	kScatter:       "scatter",
	kNewGroup:      "new_group",
	kSplit:         "split",
}

func (k opKind) String() string {
	if int(k) < len(opNames) && opNames[k] != "" {
		return opNames[k]
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// hasReduce reports whether the collective has a ReduceOp; hasRoot whether it
// has a root rank.
func (k opKind) hasReduce() bool { return k == kAllReduce || k == kReduceScatter || k == kReduce }
func (k opKind) hasRoot() bool {
	return k == kBroadcast || k == kReduce || k == kGather || k == kScatter
}

// CollectiveDesc describes one collective call as a rank made it. Count is in
// elements: the vector length for all-reduce, broadcast and reduce, the
// per-rank block for all-gather, gather (len(src)), reduce-scatter,
// scatter (len(dst)) and all-to-all (len(src)/size), the total for the
// uneven all-gather, and 0 for the uneven all-to-all (whose counts differ
// from rank to rank).
type CollectiveDesc struct {
	Op     string
	DType  DType
	Reduce ReduceOp
	Count  int
	Root   int
}

// String formats d like "all_reduce(f32, sum, count=10)".
func (d CollectiveDesc) String() string {
	s := d.Op + "("
	if d.DType != 0 {
		s += d.DType.String() + ", "
	}
	k := kindByName(d.Op)
	if k.hasReduce() {
		s += d.Reduce.String() + ", "
	}
	s += fmt.Sprintf("count=%d", d.Count)
	if k.hasRoot() {
		s += fmt.Sprintf(", root=%d", d.Root)
	}
	return s + ")"
}

func kindByName(name string) opKind {
	for k, n := range opNames {
		if n == name && n != "" {
			return opKind(k)
		}
	}
	return 0
}

// Fingerprint layout (most significant bit first): op kind 6 bits, dtype 3,
// reduce op 3, root 16, count 36. It is reversible, so a rank that receives a
// foreign fingerprint can say exactly what its peer called.
const (
	fpCountBits = 36
	fpRootBits  = 16
	fpRootShift = fpCountBits
	fpOpShift   = fpRootShift + fpRootBits
	fpDTShift   = fpOpShift + 3
	fpKindShift = fpDTShift + 3

	// MaxCount is the largest element count a collective accepts.
	MaxCount = 1<<fpCountBits - 1
	// MaxWorldSize is the largest world size a ProcessGroup accepts.
	MaxWorldSize = 1 << fpRootBits
)

// fingerprint packs a collective's parameters; see the layout above.
func fingerprint(k opKind, dt DType, op ReduceOp, root, count int) uint64 {
	return uint64(k)<<fpKindShift | uint64(dt&7)<<fpDTShift | uint64(op&7)<<fpOpShift |
		uint64(root)&(1<<fpRootBits-1)<<fpRootShift | uint64(count)&MaxCount
}

// describe unpacks a fingerprint.
func describe(fp uint64) CollectiveDesc {
	return CollectiveDesc{
		Op:     opKind(fp >> fpKindShift).String(),
		DType:  DType(fp >> fpDTShift & 7),
		Reduce: ReduceOp(fp >> fpOpShift & 7),
		Root:   int(fp >> fpRootShift & (1<<fpRootBits - 1)),
		Count:  int(fp & MaxCount),
	}
}

// bf16FromF32 rounds f to bfloat16, to nearest with ties to even. NaNs stay
// (quiet) NaNs.
func bf16FromF32(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x0040
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// f32FromBF16 widens a bfloat16 exactly.
func f32FromBF16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
