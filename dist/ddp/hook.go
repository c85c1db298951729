package ddp

import (
	"fmt"
	"hash"
	"runtime"

	"github.com/chewxy/hm"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/internal/shard"
)

// Hook returns hook(p), the node to use in the forward pass in place of the
// parameter p. It is the identity on values; the gradient that flows back
// through it is p's gradient, and the hook's gradient op hands it to the DDP,
// which all-reduces a bucket as soon as its last gradient has arrived.
//
// For that all-reduce to overlap the rest of the backward pass, call Hook
// where p is used, right before the op that consumes it, not for all
// parameters up front: the TapeMachine executes nodes in creation order and
// gorgonia.Backpropagate creates the hook's gradient op when it reaches the
// hook node, walking the graph in reverse creation order — a hook created
// before the whole forward pass is reached last, so its gradient op would
// run at the very end of backprop. Results are the same either way.
//
// The hook copies its input into an output buffer that every pass reuses,
// so a training step allocates nothing per parameter. The gradient op
// passes the gradient through in place where nothing else reads it (the
// usual case: the compiler gives it its input's register, as it does for
// a reshape) and copies it into such a buffer otherwise. hook(p).Value()
// and the gradient node's value are valid until the next pass, like any
// value a TapeMachine may reuse.
//
// Hook returns the same node for every call with the same parameter, so a
// parameter used twice (weight tying) has one hook, created at its first use.
// Like all graph construction it must not run concurrently with other
// Gorgonia graph building.
func (d *DDP) Hook(p *gorgonia.Node) (*gorgonia.Node, error) {
	i, ok := d.index[p]
	if !ok {
		return nil, fmt.Errorf("ddp: hook of %v: %w", p, ErrNotParam)
	}
	d.mu.Lock()
	h, err := d.hooks[i], d.closedLocked("hook of "+p.Name())
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if h != nil {
		return h, nil
	}
	h, err = gorgonia.ApplyOp(&hookOp{d: d, i: i}, p)
	if err != nil {
		return nil, fmt.Errorf("ddp: hook of %s: %w", p.Name(), err)
	}
	d.mu.Lock()
	d.hooks[i] = h
	if d.firstHook < 0 {
		d.firstHook = i
	}
	d.mu.Unlock()
	return h, nil
}

// Hooked returns Hook(p) for every parameter, in parameter order. It suits
// models that take all their parameters up front (for example
// mlp.Model.ForwardWith); the training result is the same as with Hook at
// every use, but the all-reduces cannot overlap backprop (see Hook).
func (d *DDP) Hooked() (gorgonia.Nodes, error) {
	out := make(gorgonia.Nodes, len(d.params))
	for i, p := range d.params {
		h, err := d.Hook(p)
		if err != nil {
			return nil, err
		}
		out[i] = h
	}
	return out, nil
}

// hookOp is hook(w): the identity on values, whose gradient op reports w's
// gradient to the DDP.
type hookOp struct {
	d   *DDP
	i   int            // parameter index
	out gorgonia.Value // output buffer, reused by every pass (see reuseCopy)
}

var _ gorgonia.SDOp = (*hookOp)(nil)

func (op *hookOp) Arity() int { return 1 }

func (op *hookOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}

func (op *hookOp) InferShape(inputs ...gorgonia.DimSizer) (tensor.Shape, error) {
	return shard.FirstShape(inputs)
}

// Do returns a copy of the parameter's value: returning the value itself
// would let a later in-place op (the compiler reuses registers) write into
// the parameter. The copy is made into the same buffer on every pass (see
// reuseCopy), so that a step allocates nothing.
func (op *hookOp) Do(inputs ...gorgonia.Value) (gorgonia.Value, error) {
	if len(inputs) != 1 {
		return nil, fmt.Errorf("ddp: %v: want 1 input, got %d: %w", op, len(inputs), dist.ErrInvalidArgument)
	}
	op.d.forwardSeen(op.i)
	return reuseCopy(&op.out, inputs[0])
}

func (op *hookOp) ReturnsPtr() bool     { return false }
func (op *hookOp) CallsExtern() bool    { return false }
func (op *hookOp) OverwritesInput() int { return -1 }

func (op *hookOp) WriteHash(h hash.Hash) { fmt.Fprintf(h, "gdist.ddp.Hook#%d.%d", op.d.id, op.i) }

func (op *hookOp) Hashcode() uint32 { return shard.HashOf(op) }

func (op *hookOp) String() string { return fmt.Sprintf("DDPHook(%s)", op.d.params[op.i].Name()) }

func (op *hookOp) DiffWRT(inputs int) []bool { return []bool{true} }

// SymDiff adds the hook's gradient op, which passes grad through as the
// parameter's gradient and hands it to the DDP. Backpropagate calls it right
// after it has summed the hook's incoming gradient, so the gradient op runs
// (in creation order) as soon as that gradient is computed.
func (op *hookOp) SymDiff(inputs gorgonia.Nodes, output, grad *gorgonia.Node) (gorgonia.Nodes, error) {
	d := op.d
	d.mu.Lock()
	exists := d.gradNodes[op.i] != nil
	d.mu.Unlock()
	if exists {
		return nil, fmt.Errorf("ddp: %v differentiated twice: %w", op, ErrDuplicateGradient)
	}
	gn, err := gorgonia.ApplyOp(&hookGradOp{d: d, i: op.i}, grad)
	if err != nil {
		return nil, fmt.Errorf("ddp: gradient of %v: %w", op, err)
	}
	d.mu.Lock()
	d.gradNodes[op.i] = gn
	d.nGrad++
	d.bkts[d.slots[op.i].bucket].nGrad++
	d.mu.Unlock()
	return gorgonia.Nodes{gn}, nil
}

// hookGradOp is the gradient op of hook(w): the identity on the gradient,
// which it also adds into the DDP's bucket and, when the bucket is complete,
// starts the bucket's all-reduce.
type hookGradOp struct {
	d   *DDP
	i   int
	out gorgonia.Value // output buffer, reused by every pass (see reuseCopy)
}

func (op *hookGradOp) Arity() int { return 1 }

func (op *hookGradOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(a, a)
}

func (op *hookGradOp) InferShape(inputs ...gorgonia.DimSizer) (tensor.Shape, error) {
	return shard.FirstShape(inputs)
}

// Do hands the gradient to the DDP and returns a copy of it: this rank's
// local gradient of the pass. The averaged gradient is written into the
// parameter's gradient by Sync. The copy is made into the same buffer on
// every pass (see reuseCopy). Returning the input itself would alias two
// registers the compiler believes distinct: an op that later reuses this
// op's register in place would overwrite a gradient still live elsewhere.
// Where the compiler knows the input dies here, it calls UnsafeDo instead.
func (op *hookGradOp) Do(inputs ...gorgonia.Value) (gorgonia.Value, error) {
	if err := op.hand(inputs); err != nil {
		return nil, err
	}
	return reuseCopy(&op.out, inputs[0])
}

// UnsafeDo is Do when the compiler has given this op its input's register
// (OverwritesInput): nothing else reads the input afterwards, so the
// gradient is passed through as it is, without a copy. That is the usual
// case (a parameter's gradient feeds only its hook) and saves a copy of
// every gradient per pass, on the critical path of the last bucket.
func (op *hookGradOp) UnsafeDo(inputs ...gorgonia.Value) (gorgonia.Value, error) {
	if err := op.hand(inputs); err != nil {
		return nil, err
	}
	return inputs[0], nil
}

// hand gives the gradient to the DDP.
func (op *hookGradOp) hand(inputs []gorgonia.Value) error {
	if len(inputs) != 1 {
		return fmt.Errorf("ddp: %v: want 1 input, got %d: %w", op, len(inputs), dist.ErrInvalidArgument)
	}
	launched, err := op.d.gradReady(op.i, inputs[0])
	if err != nil {
		return err
	}
	if launched {
		// Let the group's worker put the bucket on the wire now: with few
		// Ps (GOMAXPROCS=1 is common with one process per core) it would
		// otherwise wait until backprop blocks, while the peers could
		// already be reducing what it sends. It soon blocks receiving and
		// hands the P back.
		runtime.Gosched()
	}
	return nil
}

// ReturnsPtr and OverwritesInput say what reshape says: the output may be
// the input itself, which lets the register allocator give this op its
// input's register when nothing reads the input afterwards (and the machine
// then calls UnsafeDo).
func (op *hookGradOp) ReturnsPtr() bool     { return true }
func (op *hookGradOp) CallsExtern() bool    { return false }
func (op *hookGradOp) OverwritesInput() int { return 0 }

func (op *hookGradOp) WriteHash(h hash.Hash) {
	fmt.Fprintf(h, "gdist.ddp.HookGrad#%d.%d", op.d.id, op.i)
}

func (op *hookGradOp) Hashcode() uint32 { return shard.HashOf(op) }

func (op *hookGradOp) String() string {
	return fmt.Sprintf("DDPHookGrad(%s)", op.d.params[op.i].Name())
}

// reuseCopy copies v into *buf and returns *buf, allocating *buf (a clone
// of v) on the first call or when v's type, dtype or shape changed.
//
// Handing out the same buffer on every pass is safe under a TapeMachine:
// the buffer is rewritten at the start of its node's life in each pass, and
// the compiler lets other ops write into it (in place, or as a reused
// register) only once that node's value is dead for the rest of the pass —
// the same as with a fresh value, which the machine would equally reuse. The
// node's Value() after RunAll is therefore the buffer, valid until the next
// pass. One machine per DDP (see the package documentation) means Do is
// never called concurrently for one op.
func reuseCopy(buf *gorgonia.Value, v gorgonia.Value) (gorgonia.Value, error) {
	switch x := v.(type) {
	case *gorgonia.F32:
		if b, ok := (*buf).(*gorgonia.F32); ok {
			*b = *x
			return b, nil
		}
	case *gorgonia.F64:
		if b, ok := (*buf).(*gorgonia.F64); ok {
			*b = *x
			return b, nil
		}
	case tensor.Tensor:
		if b, ok := (*buf).(tensor.Tensor); ok && b.Dtype() == x.Dtype() && b.Shape().Eq(x.Shape()) {
			s32, s64, err1 := shard.Floats(x)
			d32, d64, err2 := shard.Floats(b)
			if err1 == nil && err2 == nil && len(s32) == len(d32) && len(s64) == len(d64) {
				copy(d32, s32)
				copy(d64, s64)
				return b, nil
			}
		}
	}
	c, err := shard.Clone(v)
	if err != nil {
		return nil, err
	}
	if t, ok := c.(tensor.Tensor); ok && t.RequiresIterator() {
		return c, nil // a view: never reused
	}
	*buf = c
	return c, nil
}
