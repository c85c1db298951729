package checkpoint

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"unicode/utf8"
)

// State is everything a training run needs to resume: the model's
// configuration and parameters, the optimizer's state, where training was
// (step, epoch, sampler position), the RNG state and free-form metadata.
// Every field but Config and Params is optional; WriteState does not retain
// or modify a State.
type State struct {
	// Config is the model configuration, any value encoding/json encodes.
	Config any
	// Params are the model's tensors, in the parameter namespace.
	Params []Named
	// Optimizer is the optimizer's state, or nil.
	Optimizer *Optimizer
	// Step and Epoch say where training was.
	Step, Epoch int64
	// Sampler is the data sampler's position, opaque bytes such as a
	// DistributedSampler's MarshalBinary.
	Sampler []byte
	// RNG is the random number generator's state, opaque bytes such as a
	// math/rand/v2 PCG's MarshalBinary.
	RNG []byte
	// Meta is user metadata. Keys are at most MaxNameBytes long.
	Meta map[string]string
}

// Optimizer is a solver's exportable state: its kind, iteration count,
// hyper-parameters and per-parameter slots. The package gives the fields no
// meaning beyond storing them.
type Optimizer struct {
	// Kind names the solver, e.g. "adam".
	Kind string
	// Iter is the solver's iteration count.
	Iter int64
	// Scalars are numeric hyper-parameters and state (learning rate,
	// betas, ...). Names are at most MaxNameBytes long.
	Scalars map[string]float64
	// Strings are textual settings. Names are at most MaxNameBytes long.
	Strings map[string]string
	// Slots are the per-parameter tensors (moments, velocities), in their
	// own namespace: a slot may have the same name as a parameter. A
	// convention is "<param>/<slot>", e.g. "layer0.w/m". Wrap a []float32 or
	// []float64 v as tensor.New(tensor.WithBacking(v)).
	Slots []Named
}

// Slot returns the named optimizer slot, or an error matching
// ErrMissingTensor. The tensor is shared with o.
func (o *Optimizer) Slot(name string) (Named, error) {
	for _, s := range o.Slots {
		if s.Name == name {
			return s, nil
		}
	}
	return Named{}, fmt.Errorf("%w: optimizer slot %q", ErrMissingTensor, name)
}

// encodeState encodes the state record (everything but the configuration
// and the tensors) as described in the package documentation.
func encodeState(s *State) ([]byte, error) {
	le := binary.LittleEndian
	b := le.AppendUint64(nil, uint64(s.Step))
	b = le.AppendUint64(b, uint64(s.Epoch))
	var err error
	bytes32 := func(v []byte, what string) {
		if err == nil && uint64(len(v)) > MaxHeaderBytes {
			err = fmt.Errorf("checkpoint: %w: %s of %d bytes", ErrInvalidArgument, what, len(v))
		}
		b = le.AppendUint32(b, uint32(len(v)))
		b = append(b, v...)
	}
	name16 := func(v, what string) {
		if err == nil && len(v) > MaxNameBytes {
			err = fmt.Errorf("checkpoint: %w: %s of %d bytes", ErrInvalidArgument, what, len(v))
		}
		b = le.AppendUint16(b, uint16(len(v)))
		b = append(b, v...)
	}
	bytes32(s.Sampler, "sampler state")
	bytes32(s.RNG, "RNG state")
	b = le.AppendUint32(b, uint32(len(s.Meta)))
	for _, k := range slices.Sorted(maps.Keys(s.Meta)) {
		name16(k, "metadata key")
		bytes32([]byte(s.Meta[k]), "metadata value")
	}
	if o := s.Optimizer; o == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		name16(o.Kind, "optimizer kind")
		b = le.AppendUint64(b, uint64(o.Iter))
		b = le.AppendUint32(b, uint32(len(o.Scalars)))
		for _, k := range slices.Sorted(maps.Keys(o.Scalars)) {
			name16(k, "optimizer scalar name")
			b = le.AppendUint64(b, math.Float64bits(o.Scalars[k]))
		}
		b = le.AppendUint32(b, uint32(len(o.Strings)))
		for _, k := range slices.Sorted(maps.Keys(o.Strings)) {
			name16(k, "optimizer string name")
			bytes32([]byte(o.Strings[k]), "optimizer string")
		}
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// decodeState parses a state record. The Optimizer it returns has no Slots.
func decodeState(b []byte) (*State, error) {
	p := &parser{b: b}
	s := &State{Step: int64(p.u64("step")), Epoch: int64(p.u64("epoch"))}
	if v := p.bytes32("sampler state"); len(v) > 0 {
		s.Sampler = append([]byte(nil), v...)
	}
	if v := p.bytes32("RNG state"); len(v) > 0 {
		s.RNG = append([]byte(nil), v...)
	}
	s.Meta = p.stringMap("metadata", func() string { return string(p.bytes32("metadata value")) })
	switch has := p.u8("optimizer flag"); {
	case p.err != nil:
	case has == 1:
		o := &Optimizer{Kind: string(p.bytes16("optimizer kind")), Iter: int64(p.u64("optimizer iteration"))}
		if p.err == nil && !utf8.ValidString(o.Kind) {
			return nil, corrupt("optimizer kind %q is not UTF-8", o.Kind)
		}
		if sc := p.stringMap("optimizer scalars", func() string { return string(p.bytes(8, "optimizer scalar")) }); sc != nil {
			o.Scalars = make(map[string]float64, len(sc))
			for k, v := range sc {
				o.Scalars[k] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(v)))
			}
		}
		o.Strings = p.stringMap("optimizer strings", func() string { return string(p.bytes32("optimizer string")) })
		s.Optimizer = o
	case has != 0:
		return nil, corrupt("optimizer flag %d", has)
	}
	if p.err != nil {
		return nil, p.err
	}
	if len(p.b) != 0 {
		return nil, corrupt("%d trailing bytes in the state record", len(p.b))
	}
	return s, nil
}

// parser reads little-endian fields from a header; the first short read
// sets err (matching ErrCorrupt), after which every read returns zero.
type parser struct {
	b   []byte
	err error
}

func (p *parser) bytes(n uint64, what string) []byte {
	if p.err != nil {
		return nil
	}
	if uint64(len(p.b)) < n {
		p.err = corrupt("header ends inside %s", what)
		return nil
	}
	v := p.b[:n:n]
	p.b = p.b[n:]
	return v
}

func (p *parser) u8(what string) uint8 {
	if v := p.bytes(1, what); v != nil {
		return v[0]
	}
	return 0
}

func (p *parser) u16(what string) uint16 {
	if v := p.bytes(2, what); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (p *parser) u32(what string) uint32 {
	if v := p.bytes(4, what); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (p *parser) u64(what string) uint64 {
	if v := p.bytes(8, what); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

// bytes16 and bytes32 read a length-prefixed byte string.
func (p *parser) bytes16(what string) []byte { return p.bytes(uint64(p.u16(what+" length")), what) }
func (p *parser) bytes32(what string) []byte { return p.bytes(uint64(p.u32(what+" length")), what) }

// stringMap reads a u32 count and that many (u16-prefixed key, value)
// pairs, keys strictly increasing as the writer sorts them. It returns nil
// for an empty map.
func (p *parser) stringMap(what string, value func() string) map[string]string {
	n := p.u32(what + " count")
	if p.err != nil || n == 0 {
		return nil
	}
	if uint64(n) > uint64(len(p.b))/2 { // every key takes at least 2 bytes
		p.err = corrupt("%s count %d too large for header", what, n)
		return nil
	}
	m := make(map[string]string, min(n, 1024))
	prev := ""
	for i := range n {
		k := string(p.bytes16(what + " key"))
		v := value()
		if p.err != nil {
			return nil
		}
		if i > 0 && k <= prev {
			p.err = corrupt("%s keys out of order at %q", what, k)
			return nil
		}
		m[k], prev = v, k
	}
	return m
}
