package transformer

import (
	"fmt"
	"strings"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/internal/options"
	"github.com/gdist/gdist/train/checkpoint"
)

// Comm is the communication of a tensor-parallel stage: Megatron-LM's two
// conjugate operators over the ranks of a tensor-parallel group. This
// package never communicates itself; dist/tp implements Comm with
// collectives.
type Comm interface {
	// Copy is Megatron's f: the identity in the forward pass, an
	// all-reduce (sum) of the gradient over the group in the backward pass.
	// A stage applies it to the input of every column-parallel layer.
	Copy(x *gorgonia.Node) (*gorgonia.Node, error)
	// Reduce is Megatron's g: an all-reduce (sum) over the group in the
	// forward pass, the identity in the backward pass. A stage applies it
	// to the output of every row-parallel layer.
	Reduce(x *gorgonia.Node) (*gorgonia.Node, error)
}

// TensorParallel places a stage on member Rank of a tensor-parallel group of
// Size members (Megatron-LM's scheme): the attention heads, the MLP's hidden
// units and the vocabulary are split into Size contiguous parts, of which
// the stage holds part Rank.
//
//   - Attention: wq, wk and wv are column-parallel (the stage computes the
//     Heads/Size heads of its part), wo is row-parallel; Comm.Copy before the
//     three projections, Comm.Reduce after wo, then the replicated bias bo.
//   - MLP: w1 and b1 column-parallel, w2 row-parallel; Comm.Copy before w1,
//     Comm.Reduce after w2, then the replicated bias b2.
//   - Embedding: tok_emb is vocabulary-parallel (rows VocabPart of the
//     vocabulary); the input is the stage's part of the one-hot tokens
//     [Rows, part] (FillOneHotPart), and Comm.Reduce sums the parts.
//   - Head: head.w and head.b are vocabulary-parallel (columns); Comm.Copy
//     before them; the output is this part of the logits [Rows, part], which
//     a vocabulary-parallel loss (dist/tp) consumes without ever gathering
//     the whole vocabulary.
//
// Layer norms, pos_emb, attn.bo and mlp.b2 are replicated: every member
// computes the same values and gradients. Heads and MLPHidden must be
// multiples of Size and Vocab at least Size; the vocabulary may split
// unevenly (Partition). Size 1 (or the zero value) is the plain model.
type TensorParallel struct {
	Rank, Size int
	Comm       Comm
}

// enabled reports whether tp splits anything.
func (tp TensorParallel) enabled() bool { return tp.Size > 1 }

// validate checks tp against cfg.
func (tp TensorParallel) validate(cfg Config) error {
	if tp.Size == 0 && tp.Rank == 0 && tp.Comm == nil {
		return nil
	}
	switch {
	case tp.Size < 1 || tp.Rank < 0 || tp.Rank >= tp.Size:
		return fmt.Errorf("transformer: %w: tensor-parallel rank %d of %d", ErrInvalidArgument, tp.Rank, tp.Size)
	case tp.Size > 1 && tp.Comm == nil:
		return fmt.Errorf("transformer: %w: tensor parallelism over %d ranks without a Comm", ErrInvalidArgument, tp.Size)
	case cfg.Heads%tp.Size != 0:
		return fmt.Errorf("transformer: %w: %d heads do not split over %d tensor-parallel ranks", ErrInvalidArgument, cfg.Heads, tp.Size)
	case cfg.MLPHidden%tp.Size != 0:
		return fmt.Errorf("transformer: %w: MLP hidden size %d does not split over %d tensor-parallel ranks", ErrInvalidArgument, cfg.MLPHidden, tp.Size)
	case cfg.Vocab < tp.Size:
		return fmt.Errorf("transformer: %w: vocabulary of %d over %d tensor-parallel ranks", ErrInvalidArgument, cfg.Vocab, tp.Size)
	}
	return nil
}

// size returns tp.Size, 1 for the zero value.
func (tp TensorParallel) size() int { return max(tp.Size, 1) }

// StageOption configures NewStage and NewDecoder. Each option checks its
// value when applied; the constructor fails with the first refusal, an
// error matching ErrInvalidArgument. A nil StageOption is refused the same
// way.
type StageOption func(*stageOptions) error

type stageOptions struct {
	tp       TensorParallel
	lock     sync.Locker // NewDecoder: held while building
	stepRows int         // NewDecoder: the width of a decoding pass
	share    *Stage      // NewStage: hold this stage's parameter tensors instead of new ones
}

// shareParams makes NewStage use the parameter tensors of st (a stage of the
// same layers and placement) instead of initialising its own: a Decoder's
// passes share one set of weights.
func shareParams(st *Stage) StageOption {
	return func(o *stageOptions) error {
		o.share = st
		return nil
	}
}

// WithTensorParallel builds the stage as member tp.Rank of a
// tensor-parallel group of tp.Size (see TensorParallel). dist/tp's
// NewStage passes it with a Comm over a process group.
func WithTensorParallel(tp TensorParallel) StageOption {
	return func(o *stageOptions) error {
		if tp.Size < 1 {
			return fmt.Errorf("transformer: %w: WithTensorParallel: size %d", ErrInvalidArgument, tp.Size)
		}
		o.tp = tp
		return nil
	}
}

func stageConfig(cfg Config, opts []StageOption) (stageOptions, error) {
	var o stageOptions
	if err := options.Apply(&o, opts, "transformer", ErrInvalidArgument); err != nil {
		return o, err
	}
	if err := o.tp.validate(cfg); err != nil {
		return o, err
	}
	return o, nil
}

// Partition returns the half-open range [lo, hi) of part i when n items are
// split into parts contiguous parts: lo = i*n/parts. Parts differ in size
// by at most one; they are equal when parts divides n.
func Partition(n, parts, i int) (lo, hi int) {
	return i * n / parts, (i + 1) * n / parts
}

// VocabPart returns the token ids [lo, hi) that member rank of a
// tensor-parallel group of size members holds (Partition of cfg.Vocab).
func VocabPart(cfg Config, rank, size int) (lo, hi int) { return Partition(cfg.Vocab, size, rank) }

// Replicated is the ShardAxis of a parameter every tensor-parallel member
// holds whole.
const Replicated = -1

// ShardAxis returns the axis along which tensor parallelism splits the
// parameter name (0: rows or, for a vector, its elements; 1: columns), or
// Replicated. See TensorParallel for which parameter goes where. An
// unknown name is an error matching ErrInvalidArgument.
func ShardAxis(name string) (int, error) {
	_, suffix, ok := strings.Cut(name, ".")
	if _, isLayer := LayerOf(name); !ok || !isLayer {
		return 0, fmt.Errorf("transformer: %w: parameter name %q", ErrInvalidArgument, name)
	}
	switch suffix {
	case "tok_emb", "attn.wo", "mlp.w2", "mlp.b1", "head.b":
		return 0, nil
	case "attn.wq", "attn.wk", "attn.wv", "mlp.w1", "head.w":
		return 1, nil
	case "pos_emb", "ln1.g", "ln1.b", "ln2.g", "ln2.b", "attn.bo", "mlp.b2", "ln.g", "ln.b":
		return Replicated, nil
	}
	return 0, fmt.Errorf("transformer: %w: parameter name %q", ErrInvalidArgument, name)
}

// shardShape returns the shape of member rank's part of a parameter of
// full shape along axis (Replicated: the full shape).
func shardShape(full tensor.Shape, axis, rank, size int) tensor.Shape {
	s := full.Clone()
	if axis != Replicated && size > 1 {
		lo, hi := Partition(full[axis], size, rank)
		s[axis] = hi - lo
	}
	return s
}

// Shard returns member rank's part of every tensor in ts (a whole model's
// parameters, or some layers of it), split as TensorParallel says, in the
// order of ts: sharding on load, so that a tensor-parallel stage starts from
// the same checkpoint as the single-process model. The parts are new
// tensors of the input's dtype; ts is not retained or modified.
func Shard(ts []checkpoint.Named, rank, size int) ([]checkpoint.Named, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("transformer: %w: shard %d of %d", ErrInvalidArgument, rank, size)
	}
	out := make([]checkpoint.Named, len(ts))
	for i, t := range ts {
		axis, err := ShardAxis(t.Name)
		if err != nil {
			return nil, err
		}
		d, err := sliceAxis(t.Tensor, axis, rank, size)
		if err != nil {
			return nil, fmt.Errorf("transformer: sharding %q: %w", t.Name, err)
		}
		out[i] = checkpoint.Named{Name: t.Name, Tensor: d}
	}
	return out, nil
}

// SplitTensor returns a new dense copy of part rank of size parts of t (a
// vector or a matrix) along axis (0 or 1; Replicated: a copy of all of t),
// the parts as Partition cuts them.
func SplitTensor(t tensor.Tensor, axis, rank, size int) (*tensor.Dense, error) {
	if size < 1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("transformer: %w: part %d of %d", ErrInvalidArgument, rank, size)
	}
	return sliceAxis(t, axis, rank, size)
}

// sliceAxis returns a new dense copy of part rank of t along axis.
func sliceAxis(t tensor.Tensor, axis, rank, size int) (*tensor.Dense, error) {
	d, ok := t.(*tensor.Dense)
	if !ok {
		return nil, fmt.Errorf("%w: tensor of type %T", ErrShape, t)
	}
	if d.IsView() {
		d = d.Materialize().(*tensor.Dense)
	}
	shape := d.Shape()
	if axis == Replicated || size == 1 {
		return d.Clone().(*tensor.Dense), nil
	}
	if axis >= len(shape) || shape[axis] < size {
		return nil, fmt.Errorf("%w: shape %v does not split %d ways along axis %d", ErrShape, shape, size, axis)
	}
	lo, hi := Partition(shape[axis], size, rank)
	rows, cols := shape[0], 1
	if len(shape) == 2 {
		cols = shape[1]
	}
	out := tensor.New(tensor.Of(d.Dtype()), tensor.WithShape(shardShape(shape, axis, rank, size)...))
	switch src := d.Data().(type) {
	case []float32:
		copyPart(out.Data().([]float32), src, rows, cols, axis, lo, hi)
	case []float64:
		copyPart(out.Data().([]float64), src, rows, cols, axis, lo, hi)
	default:
		return nil, fmt.Errorf("%w: data of type %T", ErrShape, src)
	}
	return out, nil
}

// copyPart copies rows [lo, hi) (axis 0) or columns [lo, hi) (axis 1) of
// the rows x cols matrix src into dst.
func copyPart[T float](dst, src []T, rows, cols, axis, lo, hi int) {
	if axis == 0 {
		copy(dst, src[lo*cols:hi*cols])
		return
	}
	w := hi - lo
	for r := range rows {
		copy(dst[r*w:(r+1)*w], src[r*cols+lo:r*cols+hi])
	}
}

// Unshard joins the parts of every tensor-parallel member — parts[r] is
// member r's tensors, all members listing the same names in the same order
// — into whole tensors, the inverse of Shard: gathering on save, so that a
// tensor-parallel model writes the single-process model's checkpoint.
// Replicated tensors are taken from member 0. The result is new; parts is
// not retained or modified.
func Unshard(parts [][]checkpoint.Named) ([]checkpoint.Named, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("transformer: %w: no parts to join", ErrInvalidArgument)
	}
	size := len(parts)
	out := make([]checkpoint.Named, len(parts[0]))
	for i, t0 := range parts[0] {
		axis, err := ShardAxis(t0.Name)
		if err != nil {
			return nil, err
		}
		ds := make([]*tensor.Dense, size)
		for r := range size {
			if len(parts[r]) != len(parts[0]) || parts[r][i].Name != t0.Name {
				return nil, fmt.Errorf("transformer: %w: part %d does not list the tensors of part 0", ErrInvalidArgument, r)
			}
			d, ok := parts[r][i].Tensor.(*tensor.Dense)
			if !ok {
				return nil, fmt.Errorf("%w: %q of part %d has type %T", ErrShape, t0.Name, r, parts[r][i].Tensor)
			}
			if d.IsView() {
				d = d.Materialize().(*tensor.Dense)
			}
			ds[r] = d
		}
		if axis == Replicated || size == 1 {
			out[i] = checkpoint.Named{Name: t0.Name, Tensor: ds[0].Clone().(*tensor.Dense)}
			continue
		}
		j, err := joinAxis(ds, axis)
		if err != nil {
			return nil, fmt.Errorf("transformer: joining %q: %w", t0.Name, err)
		}
		out[i] = checkpoint.Named{Name: t0.Name, Tensor: j}
	}
	return out, nil
}

// joinAxis concatenates ds along axis.
func joinAxis(ds []*tensor.Dense, axis int) (*tensor.Dense, error) {
	s0 := ds[0].Shape()
	full := s0.Clone()
	full[axis] = 0
	for _, d := range ds {
		s := d.Shape()
		if len(s) != len(s0) || d.Dtype() != ds[0].Dtype() {
			return nil, fmt.Errorf("%w: parts %v %v and %v %v", ErrShape, s0, ds[0].Dtype(), s, d.Dtype())
		}
		for a := range s {
			if a != axis && s[a] != s0[a] {
				return nil, fmt.Errorf("%w: parts %v and %v", ErrShape, s0, s)
			}
		}
		full[axis] += s[axis]
	}
	out := tensor.New(tensor.Of(ds[0].Dtype()), tensor.WithShape(full...))
	rows, cols := full[0], 1
	if len(full) == 2 {
		cols = full[1]
	}
	lo := 0
	for _, d := range ds {
		w := d.Shape()[axis]
		switch dst := out.Data().(type) {
		case []float32:
			pastePart(dst, d.Data().([]float32), rows, cols, axis, lo, lo+w)
		case []float64:
			pastePart(dst, d.Data().([]float64), rows, cols, axis, lo, lo+w)
		default:
			return nil, fmt.Errorf("%w: data of type %T", ErrShape, dst)
		}
		lo += w
	}
	return out, nil
}

// pastePart is the inverse of copyPart: it writes src into rows or columns
// [lo, hi) of the rows x cols matrix dst.
func pastePart[T float](dst, src []T, rows, cols, axis, lo, hi int) {
	if axis == 0 {
		copy(dst[lo*cols:hi*cols], src)
		return
	}
	w := hi - lo
	for r := range rows {
		copy(dst[r*cols+lo:r*cols+hi], src[r*w:(r+1)*w])
	}
}

// FillOneHotPart overwrites dst, a float32 or float64 [len(ids), hi-lo]
// matrix, with the columns [lo, hi) of the one-hot encoding of ids: a
// tensor-parallel member's part of the input or the targets (VocabPart).
// Rows whose id is outside [lo, hi) are zero. An id outside [0, vocab) is
// an error matching ErrToken.
func FillOneHotPart(dst *tensor.Dense, ids []int, lo, hi, vocab int) error {
	shape := dst.Shape()
	if len(shape) != 2 || shape[0] != len(ids) || shape[1] != hi-lo || lo < 0 || hi > vocab {
		return fmt.Errorf("%w: one-hot part %v for %d ids, columns [%d, %d) of %d", ErrShape, shape, len(ids), lo, hi, vocab)
	}
	w := hi - lo
	switch d := dst.Data().(type) {
	case []float32:
		return fillPart(d, ids, lo, hi, w, vocab)
	case []float64:
		return fillPart(d, ids, lo, hi, w, vocab)
	}
	return fmt.Errorf("%w: one-hot part of type %T", ErrShape, dst.Data())
}

func fillPart[T float](d []T, ids []int, lo, hi, w, vocab int) error {
	clear(d)
	for i, id := range ids {
		if id < 0 || id >= vocab {
			return fmt.Errorf("%w: id %d at %d (vocab %d)", ErrToken, id, i, vocab)
		}
		if id >= lo && id < hi {
			d[i*w+id-lo] = 1
		}
	}
	return nil
}
