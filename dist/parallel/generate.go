package parallel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/timeline"
	"github.com/gdist/gdist/dist/tp"
	"github.com/gdist/gdist/models/transformer"
)

// Point-to-point tags of a Generator (below pipeline.DefaultTagBase's range).
const (
	tagHidden uint32 = 0x30000000 + iota // hidden states to the next stage
	tagTokens                            // sampled tokens, last stage to first
)

// Generator serves generation requests with a KV cache on a Layout: each
// of the DP replicas is a pipeline of PP stages, each stage a
// transformer.Decoder over its layers split over TP members, and serves
// requests of its own. Requests are cut into groups that move
// through the stages one after another, so that while the last stage
// samples a group's next tokens the first already runs the next group:
// every stage works at once. The tokens are those transformer.Generate
// gives each request alone on one process. Every rank makes the same
// calls; it is not safe for concurrent use. With the job's timeline on
// (GDIST_TIMELINE) every Generate call, decoder pass and wait for the
// previous or the last stage is an event on it.
type Generator struct {
	groups    *Groups
	cfg       transformer.Config
	dec       *transformer.Decoder
	stage     [2]int
	slots     int
	nGroups   int
	ownGroups bool
}

// NewGenerator builds this rank's part of a generator of cfg for up to
// slots requests at once: a collective over pg. WithWeights gives the
// whole model (each rank keeps its stage's part), WithGroups the number of
// request groups in flight (default PP).
func NewGenerator(ctx context.Context, pg *dist.ProcessGroup, cfg transformer.Config, l Layout, slots int, opts ...Option) (*Generator, error) {
	c, err := setup(pg, cfg, l, opts)
	if err != nil {
		return nil, err
	}
	if slots < 1 {
		return nil, fmt.Errorf("parallel: %d slots: %w", slots, ErrInvalidArgument)
	}
	gs, err := NewGroups(ctx, pg, l)
	if err != nil {
		return nil, err
	}
	g := &Generator{groups: gs, cfg: cfg, slots: slots, stage: l.Stages(cfg.NumLayers())[gs.PP.Rank()], nGroups: c.groups, ownGroups: true}
	if g.nGroups == 0 {
		g.nGroups = l.PP
	}
	g.nGroups = min(g.nGroups, slots)
	perGroup := (slots + g.nGroups - 1) / g.nGroups
	dopts := []transformer.StageOption{transformer.WithBuildLock(c.lock), transformer.WithStepRows(perGroup)}
	if l.TP > 1 {
		dopts = append(dopts, tp.Placement(gs.TP))
	}
	// The decoder's passes are as wide as a group.
	if g.dec, err = transformer.NewDecoder(cfg, g.stage[0], g.stage[1], perGroup*g.nGroups, dopts...); err != nil {
		gs.Close()
		return nil, err
	}
	if c.weights != nil {
		w, err := stageWeights(c.weights, cfg, g.stage, gs.TP)
		if err == nil {
			err = g.dec.SetWeights(w)
		}
		if err != nil {
			g.Close()
			return nil, err
		}
	}
	return g, nil
}

// Groups returns the generator's groups (Groups().DP.Rank() is this rank's
// replica).
func (g *Generator) Groups() *Groups { return g.groups }

// Decoder returns this rank's decoder.
func (g *Generator) Decoder() *transformer.Decoder { return g.dec }

// Generate continues every request (at most the generator's slots) and
// returns the new tokens of each on the pipeline's first and last stages
// (nil elsewhere). Every rank of a replica passes the same requests; the
// replicas (DP > 1) serve different ones, or as many, independently: a
// replica whose requests are done returns without waiting for the others.
func (g *Generator) Generate(ctx context.Context, reqs []transformer.Request) ([][]int, error) {
	if len(reqs) > g.slots {
		return nil, fmt.Errorf("parallel: %d requests for %d slots: %w", len(reqs), g.slots, ErrInvalidArgument)
	}
	pp := g.groups.PP
	first, last := pp.Rank() == 0, pp.Rank() == pp.WorldSize()-1
	nGroups := min(g.nGroups, max(len(reqs), 1))
	perGroup := (len(reqs) + nGroups - 1) / nGroups
	type group struct {
		st      *transformer.BatchState
		offset  int // slot of its first request
		pending int // tokens the first stage awaits from the last
	}
	var groups []*group
	for off := 0; off < len(reqs); off += perGroup {
		end := min(off+perGroup, len(reqs))
		st := transformer.NewBatchState(reqs[off:end], g.cfg.Ctx)
		if err := st.Err(); err != nil {
			return nil, err
		}
		groups = append(groups, &group{st: st, offset: off})
	}
	var hidden []float64
	var hidden32 []float32
	tokBuf := make([]float64, perGroup)
	defer g.span("generation", "generate", time.Now())
	for {
		busy := false
		for gi, gr := range groups {
			if first && gr.pending > 0 {
				start := time.Now()
				if err := g.recvTokens(ctx, gr.st, tokBuf[:gr.pending]); err != nil {
					return nil, err
				}
				g.span("generation receive", "receive tokens", start)
				gr.pending = 0
			}
			if gr.st.Done() {
				continue
			}
			busy = true
			rows, ids, lastRows := gr.st.Plan(first)
			for i := range rows {
				rows[i].Slot += gr.offset
			}
			var in any
			if !first {
				start := time.Now()
				var err error
				if in, err = g.recvHidden(ctx, len(rows), &hidden, &hidden32); err != nil {
					return nil, err
				}
				g.span("generation receive", "receive hidden states", start)
			}
			start := time.Now()
			out, err := g.dec.Forward(ctx, rows, ids, in)
			if err != nil {
				return nil, err
			}
			g.span("generation compute", groupName(gi), start)
			if !last {
				if err := pp.Send(ctx, pp.Rank()+1, tagHidden, rawBytes(out)); err != nil {
					return nil, err
				}
				if !first {
					gr.st.Append(make([]int, len(lastRows))) // lengths are all a middle stage needs
				} else {
					gr.pending = len(lastRows)
				}
				continue
			}
			logits, err := g.lastLogits(ctx, out, lastRows)
			if err != nil {
				return nil, err
			}
			chosen := gr.st.Advance(func(i int) []float64 { return logits[i*g.cfg.Vocab : (i+1)*g.cfg.Vocab] })
			if !first {
				for i, c := range chosen {
					tokBuf[i] = float64(c)
				}
				if err := pp.Send(ctx, 0, tagTokens, dist.F64(tokBuf[:len(chosen)]).Bytes()); err != nil {
					return nil, err
				}
			}
		}
		if !busy {
			break
		}
	}
	if !first && !last {
		return nil, nil
	}
	var out [][]int
	for _, gr := range groups {
		out = append(out, gr.st.Tokens()...)
	}
	return out, nil
}

// span puts an event from start to now on the job's timeline, if it is on.
func (g *Generator) span(lane, name string, start time.Time) {
	if tl := g.groups.PP.Timeline(); tl != nil {
		tl.Add(timeline.Event{Lane: lane, Name: name, Cat: "generation", Start: start, End: time.Now()})
	}
}

// groupNames name the passes of the first request groups on the timeline.
var groupNames = [...]string{"forward group 0", "forward group 1", "forward group 2", "forward group 3"}

func groupName(i int) string {
	if i < len(groupNames) {
		return groupNames[i]
	}
	return fmt.Sprintf("forward group %d", i)
}

// recvTokens receives the tokens of a group's last step from the last
// stage and appends them.
func (g *Generator) recvTokens(ctx context.Context, st *transformer.BatchState, buf []float64) error {
	pp := g.groups.PP
	n, err := pp.RecvInto(ctx, pp.WorldSize()-1, tagTokens, dist.F64(buf).Bytes())
	if err != nil {
		return err
	}
	if n != 8*len(buf) {
		return fmt.Errorf("parallel: last stage sent %d bytes of tokens, want %d", n, 8*len(buf))
	}
	toks := make([]int, len(buf))
	for i, v := range buf {
		if v < 0 || v >= float64(g.cfg.Vocab) {
			return fmt.Errorf("parallel: last stage sent token %v (vocabulary %d)", v, g.cfg.Vocab)
		}
		toks[i] = int(v)
	}
	st.Append(toks)
	return nil
}

// recvHidden receives rows hidden states from the previous stage.
func (g *Generator) recvHidden(ctx context.Context, rows int, f64 *[]float64, f32 *[]float32) (any, error) {
	pp := g.groups.PP
	n := rows * g.cfg.Dim
	var b []byte
	var v any
	if g.cfg.Dtype == transformer.Float32 {
		if cap(*f32) < n {
			*f32 = make([]float32, n)
		}
		v, b = (*f32)[:n], dist.F32((*f32)[:n]).Bytes()
	} else {
		if cap(*f64) < n {
			*f64 = make([]float64, n)
		}
		v, b = (*f64)[:n], dist.F64((*f64)[:n]).Bytes()
	}
	got, err := pp.RecvInto(ctx, pp.Rank()-1, tagHidden, b)
	if err != nil {
		return nil, err
	}
	if got != len(b) {
		return nil, fmt.Errorf("parallel: previous stage sent %d bytes of hidden states, want %d", got, len(b))
	}
	return v, nil
}

// rawBytes returns the bytes of a float32 or float64 tensor.
func rawBytes(t *tensor.Dense) []byte {
	switch d := t.Data().(type) {
	case []float64:
		return dist.F64(d).Bytes()
	case []float32:
		return dist.F32(d).Bytes()
	}
	return nil
}

// lastLogits returns the whole logits of the given rows of out (this
// member's part of them when tensor-parallel), as float64, rows after rows.
func (g *Generator) lastLogits(ctx context.Context, out *tensor.Dense, rows []int) ([]float64, error) {
	w := out.Shape()[1]
	sel := tensor.New(tensor.Of(out.Dtype()), tensor.WithShape(len(rows), w))
	switch d := sel.Data().(type) {
	case []float64:
		src := out.Data().([]float64)
		for i, r := range rows {
			copy(d[i*w:(i+1)*w], src[r*w:(r+1)*w])
		}
	case []float32:
		src := out.Data().([]float32)
		for i, r := range rows {
			copy(d[i*w:(i+1)*w], src[r*w:(r+1)*w])
		}
	}
	if g.groups.Layout.TP > 1 {
		return tp.GatherLogits(ctx, g.groups.TP, sel, g.cfg.Vocab)
	}
	res := make([]float64, len(rows)*w)
	switch d := sel.Data().(type) {
	case []float64:
		copy(res, d)
	case []float32:
		for i, v := range d {
			res[i] = float64(v)
		}
	}
	return res, nil
}

// Close releases the generator (and the mesh it made).
func (g *Generator) Close() error {
	var errs []error
	if g.dec != nil {
		errs = append(errs, g.dec.Close())
	}
	if g.ownGroups {
		errs = append(errs, g.groups.Close())
	}
	return errors.Join(errs...)
}
