package transformer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/train/checkpoint"
)

// Decoder runs layers [From, To] of a model for generation with a KV cache:
// each attention layer keeps the keys and values of every position it has
// seen, for Slots sequences at once, so a new token costs one position
// instead of a forward pass over the whole context.
//
// A pass runs a list of Rows, each one position of one sequence (a slot);
// rows of one slot must come in increasing positions, and a position is
// valid once every earlier position of its slot has run (in this pass or an
// earlier one). Run a prompt as one pass of all its positions, then one row
// per new token. The results are bitwise those of the full forward pass
// over the same window (Predictor.Forward), provided the head dimension is
// at most 64; beyond that, scores may differ in the last bits.
//
// With a model of absolute positions a window that slides (a sequence
// longer than Ctx) changes every position, so past Ctx tokens each new token
// recomputes the whole window, as without a cache. A Decoder builds graphs
// for passes of Slots rows (or WithStepRows), twice that, and so on up to
// Ctx rows, all holding the same parameter tensors; a call runs in the
// narrowest pass its rows fit, a longer one in pieces of Ctx rows. It is not
// safe for concurrent use.
type Decoder struct {
	cfg      Config
	from, to int
	slots    int
	tp       TensorParallel
	cache    *KVCache
	passes   []*decodePass // by increasing rows
	out32    []float32     // backing of the last result
	out64    []float64
	outWidth int

	window []int // Runner: the window slot 0 holds
}

type decodePass struct {
	rows     int
	st       *Stage
	in, pos  *gorgonia.Node
	out      *gorgonia.Node
	vm       gorgonia.VM
	posCache []float64
}

// NewDecoder builds a decoder for layers from..to of cfg with a cache for
// slots sequences, its parameters initialised from cfg.Seed (SetWeights
// loads others). opts are the stage's (WithTensorParallel: the decoder
// holds and computes one member's part, and its passes communicate
// through the Comm; every member runs the same passes). Graph construction
// is serialised with this package's other constructors, or under the lock
// given by WithBuildLock.
func NewDecoder(cfg Config, from, to, slots int, opts ...StageOption) (*Decoder, error) {
	if slots < 1 {
		return nil, fmt.Errorf("transformer: %w: %d decoder slots", ErrInvalidArgument, slots)
	}
	o, err := stageConfig(cfg, opts)
	if err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if from < 0 || to < from || to > cfg.HeadLayer() {
		return nil, fmt.Errorf("%w: [%d, %d] with %d layers", ErrLayerRange, from, to, cfg.NumLayers())
	}
	lock := o.lock
	if lock == nil {
		lock = &buildMu
	}
	lock.Lock()
	defer lock.Unlock()
	blocks := max(0, min(to, cfg.Layers)-max(from, 1)+1)
	d := &Decoder{cfg: cfg, from: from, to: to, slots: slots, tp: o.tp,
		cache: newKVCache(cfg, blocks, slots, cfg.Heads/o.tp.size())}
	width := slots
	if o.stepRows > 0 {
		width = o.stepRows
	}
	for _, rows := range passSizes(width, cfg.Ctx) {
		p, err := d.newPass(rows, opts)
		if err != nil {
			d.Close()
			return nil, err
		}
		d.passes = append(d.passes, p)
	}
	d.outWidth = d.passes[0].st.OutputShape()[1]
	return d, nil
}

// passSizes returns the widths of a Decoder's passes: width, then doubling
// up to ctx, so that a pass of n rows computes fewer than 2n (a prompt is
// not padded to Ctx rows).
func passSizes(width, ctx int) []int {
	sizes := []int{min(width, ctx)}
	for last := sizes[0]; last < ctx; {
		last = min(2*last, ctx)
		sizes = append(sizes, last)
	}
	return sizes
}

func (d *Decoder) newPass(rows int, opts []StageOption) (*decodePass, error) {
	g := gorgonia.NewGraph()
	if len(d.passes) > 0 {
		// Every pass holds the first pass's parameter tensors.
		opts = append(opts[:len(opts):len(opts)], shareParams(d.passes[0].st))
	}
	st, err := NewStage(g, d.cfg, d.from, d.to, rows, opts...)
	if err != nil {
		return nil, err
	}
	st.kv = d.cache // one position per row
	p := &decodePass{rows: rows, st: st}
	if st.IsFirst() {
		p.pos = st.newMatrix("decoder.positions", tensor.Shape{rows, d.cfg.Ctx})
		st.pos = p.pos
	}
	p.in = st.newMatrix("decoder.in", st.InputShape())
	if p.out, err = st.Forward(p.in); err != nil {
		return nil, err
	}
	p.vm = gorgonia.NewTapeMachine(g)
	return p, nil
}

// Config returns the model configuration.
func (d *Decoder) Config() Config { return d.cfg }

// Slots returns the number of sequences the cache holds.
func (d *Decoder) Slots() int { return d.slots }

// Stage returns the stage whose parameters every pass uses (to read them,
// or set them with SetWeights).
func (d *Decoder) Stage() *Stage { return d.passes[0].st }

// SetWeights copies ts into the decoder's parameters (see
// Stage.SetWeights; on a tensor-parallel member, its parts, as Shard
// makes them).
func (d *Decoder) SetWeights(ts []checkpoint.Named) error { return d.passes[0].st.SetWeights(ts) }

// OutputWidth returns the width of a result row: Dim, or the (part of
// the) vocabulary for a decoder that ends with the head.
func (d *Decoder) OutputWidth() int { return d.outWidth }

// BlockSize returns the model's Ctx.
func (d *Decoder) BlockSize() int { return d.cfg.Ctx }

// Forward runs rows through the decoder's layers and returns their
// outputs, len(rows) rows of OutputWidth values (hidden states, or logits
// for a decoder that ends with the head) of the model dtype. The input is
// ids, one token per row, for a decoder that starts with the embedding,
// else hidden, len(rows) rows of Dim values of the model dtype ([]float32
// or []float64). The result is the decoder's until the next call; ids and
// hidden are not retained.
func (d *Decoder) Forward(ctx context.Context, rows []Row, ids []int, hidden any) (*tensor.Dense, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("transformer: decoder: %w", err)
	}
	if err := d.checkRows(rows); err != nil {
		return nil, err
	}
	first := d.from == 0
	if first && len(ids) != len(rows) {
		return nil, fmt.Errorf("%w: %d ids for %d rows", ErrShape, len(ids), len(rows))
	}
	dt := d.cfg.Dtype.Tensor()
	out := d.result(len(rows), dt)
	for done := 0; done < len(rows); {
		p := d.passes[len(d.passes)-1]
		for _, q := range d.passes {
			if q.rows >= len(rows)-done {
				p = q
				break
			}
		}
		n := min(p.rows, len(rows)-done)
		if err := d.fill(p, rows[done:done+n], ids, hidden, done); err != nil {
			return nil, err
		}
		d.cache.rows = rows[done : done+n]
		err := p.vm.RunAll()
		d.cache.rows = nil
		if err != nil {
			p.vm.Reset()
			return nil, fmt.Errorf("transformer: decoder: %w", err)
		}
		err = copyRows(out, p.out.Value(), done, n, d.outWidth)
		p.vm.Reset()
		if err != nil {
			return nil, err
		}
		done += n
	}
	return out, nil
}

// checkRows checks slots and positions.
func (d *Decoder) checkRows(rows []Row) error {
	for i, r := range rows {
		if r.Slot < 0 || r.Slot >= d.slots || r.Pos < 0 || r.Pos >= d.cfg.Ctx {
			return fmt.Errorf("%w: row %d at slot %d, position %d (%d slots, block size %d)", ErrShape, i, r.Slot, r.Pos, d.slots, d.cfg.Ctx)
		}
	}
	return nil
}

// result returns a [n, outWidth] tensor over the decoder's reused buffer.
func (d *Decoder) result(n int, dt tensor.Dtype) *tensor.Dense {
	size := n * d.outWidth
	if dt == tensor.Float32 {
		if cap(d.out32) < size {
			d.out32 = make([]float32, size)
		}
		return tensor.New(tensor.WithShape(n, d.outWidth), tensor.WithBacking(d.out32[:size]))
	}
	if cap(d.out64) < size {
		d.out64 = make([]float64, size)
	}
	return tensor.New(tensor.WithShape(n, d.outWidth), tensor.WithBacking(d.out64[:size]))
}

// fill writes the input of rows (the rows from offset of the call) into
// p's input nodes; the rest of the pass is padding.
func (d *Decoder) fill(p *decodePass, rows []Row, ids []int, hidden any, offset int) error {
	in := p.in.Value().(*tensor.Dense)
	if p.pos != nil {
		pos := p.pos.Value().(*tensor.Dense)
		ctxLen := d.cfg.Ctx
		setOneHot(pos, len(rows), ctxLen, func(i int) int { return rows[i].Pos })
		lo, hi := p.st.VocabPart()
		for i := range rows {
			if id := ids[offset+i]; id < 0 || id >= d.cfg.Vocab {
				return fmt.Errorf("%w: id %d at %d (vocab %d)", ErrToken, id, offset+i, d.cfg.Vocab)
			}
		}
		setOneHot(in, len(rows), hi-lo, func(i int) int {
			if id := ids[offset+i]; id >= lo && id < hi {
				return id - lo
			}
			return -1
		})
		return nil
	}
	w := d.cfg.Dim
	switch dst := in.Data().(type) {
	case []float32:
		src, ok := hidden.([]float32)
		if !ok || len(src) < (offset+len(rows))*w {
			return fmt.Errorf("%w: hidden states %T of %d values for %d rows of %d float32", ErrShape, hidden, lenOf(hidden), offset+len(rows), w)
		}
		clear(dst)
		copy(dst, src[offset*w:(offset+len(rows))*w])
	case []float64:
		src, ok := hidden.([]float64)
		if !ok || len(src) < (offset+len(rows))*w {
			return fmt.Errorf("%w: hidden states %T of %d values for %d rows of %d float64", ErrShape, hidden, lenOf(hidden), offset+len(rows), w)
		}
		clear(dst)
		copy(dst, src[offset*w:(offset+len(rows))*w])
	}
	return nil
}

func lenOf(x any) int {
	switch v := x.(type) {
	case []float32:
		return len(v)
	case []float64:
		return len(v)
	}
	return 0
}

// setOneHot zeroes t, a [_, width] matrix, and sets column col(i) of each
// of its first n rows (none where col returns -1).
func setOneHot(t *tensor.Dense, n, width int, col func(i int) int) {
	switch d := t.Data().(type) {
	case []float32:
		clear(d)
		for i := range n {
			if c := col(i); c >= 0 {
				d[i*width+c] = 1
			}
		}
	case []float64:
		clear(d)
		for i := range n {
			if c := col(i); c >= 0 {
				d[i*width+c] = 1
			}
		}
	}
}

// copyRows copies rows [0, n) of the pass output v into rows [at, at+n) of
// out.
func copyRows(out *tensor.Dense, v gorgonia.Value, at, n, w int) error {
	src, ok := v.(*tensor.Dense)
	if !ok {
		return fmt.Errorf("%w: decoder output %T", ErrShape, v)
	}
	if src.IsView() {
		src = src.Materialize().(*tensor.Dense)
	}
	switch o := out.Data().(type) {
	case []float32:
		copy(o[at*w:(at+n)*w], src.Data().([]float32)[:n*w])
	case []float64:
		copy(o[at*w:(at+n)*w], src.Data().([]float64)[:n*w])
	}
	return nil
}

// Logits implements Runner with slot 0 of a decoder over the whole model:
// when window extends the previous window by one token it runs that one
// position; otherwise (a new prompt, or a window that slid past Ctx) it
// runs every position of window. Generate with a Decoder therefore gives
// the tokens it gives with a Predictor. The caller owns the returned slice.
func (d *Decoder) Logits(ctx context.Context, window []int) ([]float64, error) {
	if d.from != 0 || d.to != d.cfg.HeadLayer() || d.tp.enabled() {
		return nil, fmt.Errorf("%w: Logits needs a decoder over the whole model on one process", ErrLayerRange)
	}
	if len(window) == 0 || len(window) > d.cfg.Ctx {
		return nil, fmt.Errorf("%w: %d tokens for block size %d", ErrShape, len(window), d.cfg.Ctx)
	}
	from := 0
	if len(window) == len(d.window)+1 && slices.Equal(window[:len(d.window)], d.window) {
		from = len(d.window)
	}
	rows := make([]Row, len(window)-from)
	for i := range rows {
		rows[i] = Row{Slot: 0, Pos: from + i}
	}
	d.window = d.window[:0]
	out, err := d.Forward(ctx, rows, window[from:], nil)
	if err != nil {
		return nil, err
	}
	d.window = append(d.window, window...)
	return lastRow(out), nil
}

// lastRow returns the last row of out as float64.
func lastRow(out *tensor.Dense) []float64 {
	n, w := out.Shape()[0], out.Shape()[1]
	res := make([]float64, w)
	switch o := out.Data().(type) {
	case []float32:
		for j, v := range o[(n-1)*w : n*w] {
			res[j] = float64(v)
		}
	case []float64:
		copy(res, o[(n-1)*w:n*w])
	}
	return res
}

// Close releases the decoder's machines.
func (d *Decoder) Close() error {
	var first error
	for _, p := range d.passes {
		if err := p.vm.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Cursor tracks which positions of one sequence a Decoder slot holds, so
// that each step runs only what the cache lacks. The zero value is an
// empty slot.
type Cursor struct {
	start, filled int
}

// Next returns the tokens of a sequence of n tokens that the next pass of
// its slot must run, tokens [from, n) at positions pos, pos+1, ..., and
// records them as cached; the logits of the last one give token n. The
// window is the last blockSize tokens: while it starts at the same token
// only new tokens run; once it slides, all of it runs again. Reset with
// the zero value for a new sequence.
func (c *Cursor) Next(n, blockSize int) (from, pos int) {
	start := max(0, n-blockSize)
	if start != c.start || c.filled > n-start {
		c.start, c.filled = start, 0
	}
	from, pos = start+c.filled, c.filled
	c.filled = n - start
	return from, pos
}

// Request is one prompt for GenerateBatch: continue Prompt by N tokens,
// greedily if Temperature <= 0, else sampling with NewRNG(Seed).
type Request struct {
	Prompt      []int
	N           int
	Temperature float64
	Seed        uint64
}

// GenerateBatch continues every request at once with d, a decoder over the
// whole model on one process with at least len(reqs) slots: every step runs
// one position of every unfinished request in one pass. Each request gets
// the tokens Generate gives it alone (with a Predictor or a Decoder). It
// returns the new tokens of each request (the caller owns the slices);
// reqs is not modified.
func GenerateBatch(ctx context.Context, d *Decoder, reqs []Request) ([][]int, error) {
	if d.from != 0 || d.to != d.cfg.HeadLayer() || d.tp.enabled() {
		return nil, fmt.Errorf("%w: GenerateBatch needs a decoder over the whole model on one process", ErrLayerRange)
	}
	if len(reqs) > d.slots {
		return nil, fmt.Errorf("transformer: %w: %d requests for %d decoder slots", ErrInvalidArgument, len(reqs), d.slots)
	}
	st := NewBatchState(reqs, d.cfg.Ctx)
	if err := st.Err(); err != nil {
		return nil, err
	}
	for !st.Done() {
		rows, ids, last := st.Plan(true)
		out, err := d.Forward(ctx, rows, ids, nil)
		if err != nil {
			return st.Tokens(), fmt.Errorf("transformer: generate: %w", err)
		}
		st.Advance(func(i int) []float64 { return rowFloat64(out, last[i]) })
	}
	return st.Tokens(), nil
}

// rowFloat64 returns row r of out as float64.
func rowFloat64(out *tensor.Dense, r int) []float64 {
	w := out.Shape()[1]
	res := make([]float64, w)
	switch o := out.Data().(type) {
	case []float32:
		for j, v := range o[r*w : (r+1)*w] {
			res[j] = float64(v)
		}
	case []float64:
		copy(res, o[r*w:(r+1)*w])
	}
	return res
}

// BatchState is the bookkeeping of generating for several requests at
// once with a KV cache, request i in slot i: which rows each step runs, and
// the tokens so far. Every rank of a pipeline keeps one and makes the same
// calls, so all stages agree on each pass's rows without sending them;
// only the first stage needs the tokens, only the last samples.
type BatchState struct {
	reqs    []Request
	ctx     int
	tokens  [][]int // prompt and new tokens of each request
	cursors []Cursor
	rngs    []*rand.Rand
	active  []int // requests in the current step, in order
	err     error
}

// NewBatchState starts generating reqs with a model of block size
// blockSize. An empty prompt makes Err return ErrEmptyPrompt.
func NewBatchState(reqs []Request, blockSize int) *BatchState {
	s := &BatchState{reqs: reqs, ctx: blockSize, tokens: make([][]int, len(reqs)),
		cursors: make([]Cursor, len(reqs)), rngs: make([]*rand.Rand, len(reqs))}
	for i, r := range reqs {
		if len(r.Prompt) == 0 {
			s.err = ErrEmptyPrompt
		}
		s.tokens[i] = slices.Clone(r.Prompt)
		s.rngs[i] = NewRNG(r.Seed)
	}
	return s
}

// Err returns the error of invalid requests, or nil.
func (s *BatchState) Err() error { return s.err }

// Done reports whether every request has all its tokens.
func (s *BatchState) Done() bool {
	for i, r := range s.reqs {
		if len(s.tokens[i])-len(r.Prompt) < r.N {
			return false
		}
	}
	return true
}

// Plan returns the rows of the next step — for every unfinished request,
// in order, the positions its slot lacks (see Cursor) — and, with ids, the
// token of each row; last[i] is the index of the row whose output gives
// the next token of the i-th unfinished request. Every stage of a pipeline
// calls Plan once per step; the slices are new.
func (s *BatchState) Plan(ids bool) (rows []Row, tokens []int, last []int) {
	s.active = s.active[:0]
	for i, r := range s.reqs {
		if len(s.tokens[i])-len(r.Prompt) >= r.N {
			continue
		}
		s.active = append(s.active, i)
		n := len(s.tokens[i])
		from, pos := s.cursors[i].Next(n, s.ctx)
		for j := from; j < n; j++ {
			rows = append(rows, Row{Slot: i, Pos: pos + j - from})
			if ids {
				tokens = append(tokens, s.tokens[i][j])
			}
		}
		last = append(last, len(rows)-1)
	}
	return rows, tokens, last
}

// Active returns the requests of the last Plan, in order. The slice is
// the state's until the next Plan.
func (s *BatchState) Active() []int { return s.active }

// Advance samples the next token of every request of the last Plan from
// logits(i), the logits of its last row (i indexes Active), with the
// request's temperature and generator, and appends it. It returns the
// tokens chosen, in the order of Active.
func (s *BatchState) Advance(logits func(i int) []float64) []int {
	chosen := make([]int, len(s.active))
	for i, req := range s.active {
		r := s.reqs[req]
		chosen[i] = Sample(logits(i), r.Temperature, s.rngs[req])
	}
	s.Append(chosen)
	return chosen
}

// Append appends tokens[i] to the i-th request of the last Plan: how a
// stage that does not sample learns the tokens.
func (s *BatchState) Append(tokens []int) {
	for i, req := range s.active {
		s.tokens[req] = append(s.tokens[req], tokens[i])
	}
}

// Tokens returns the new tokens of every request so far (new slices).
func (s *BatchState) Tokens() [][]int {
	out := make([][]int, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = slices.Clone(s.tokens[i][len(r.Prompt):])
	}
	return out
}

var _ Runner = (*Decoder)(nil)

// WithStepRows sets the width of a Decoder's pass for decoding, n rows
// (default: its number of slots): for a decoder whose slots are served in
// groups of n, such as a pipeline's, so that a group's step computes no
// padding rows. Wider calls run in passes of Ctx rows.
func WithStepRows(n int) StageOption {
	return func(o *stageOptions) error {
		if n < 1 {
			return fmt.Errorf("transformer: %w: WithStepRows(%d)", ErrInvalidArgument, n)
		}
		o.stepRows = n
		return nil
	}
}

// WithBuildLock makes NewDecoder build its graphs under l instead of this
// package's own lock: pass the lock that serialises the other graph
// construction of the program (in-process tests with several ranks).
func WithBuildLock(l sync.Locker) StageOption {
	return func(o *stageOptions) error {
		if l == nil {
			return fmt.Errorf("transformer: %w: WithBuildLock(nil)", ErrInvalidArgument)
		}
		o.lock = l
		return nil
	}
}
