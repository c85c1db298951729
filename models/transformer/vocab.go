package transformer

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Vocab is a character-level vocabulary: the sorted set of distinct runes of
// a text, with token id i standing for the i-th rune. A Vocab is immutable
// and safe for concurrent use. Its JSON form is the string of its runes in id
// order.
type Vocab struct {
	runes []rune
	index map[rune]int
}

// NewVocab returns the vocabulary of the distinct runes in text, sorted by
// code point. Invalid UTF-8 bytes become utf8.RuneError (U+FFFD).
func NewVocab(text string) *Vocab {
	seen := make(map[rune]bool)
	for _, r := range text {
		seen[r] = true
	}
	runes := make([]rune, 0, len(seen))
	for r := range seen {
		runes = append(runes, r)
	}
	slices.Sort(runes)
	return newVocab(runes)
}

// VocabFromRunes returns a vocabulary with the given runes as ids 0..n-1, in
// the given order. The runes must be distinct. The caller keeps ownership of
// runes; the Vocab copies it.
func VocabFromRunes(runes []rune) (*Vocab, error) {
	seen := make(map[rune]bool, len(runes))
	for _, r := range runes {
		if seen[r] {
			return nil, fmt.Errorf("transformer: %w: duplicate rune %q in vocabulary", ErrInvalidArgument, r)
		}
		seen[r] = true
	}
	return newVocab(slices.Clone(runes)), nil
}

func newVocab(runes []rune) *Vocab {
	v := &Vocab{runes: runes, index: make(map[rune]int, len(runes))}
	for i, r := range runes {
		v.index[r] = i
	}
	return v
}

// Size returns the number of tokens.
func (v *Vocab) Size() int { return len(v.runes) }

// Runes returns the runes in id order. The caller owns the returned slice.
func (v *Vocab) Runes() []rune { return slices.Clone(v.runes) }

// ID returns the token id of r and whether r is in the vocabulary.
func (v *Vocab) ID(r rune) (int, bool) {
	id, ok := v.index[r]
	return id, ok
}

// Encode returns the token ids of s. A rune not in the vocabulary is an
// error matching ErrUnknownRune. The caller owns the returned slice.
func (v *Vocab) Encode(s string) ([]int, error) {
	ids := make([]int, 0, utf8.RuneCountInString(s))
	for i, r := range s {
		id, ok := v.index[r]
		if !ok {
			return nil, fmt.Errorf("%w: %q at byte %d", ErrUnknownRune, r, i)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// Decode returns the text of ids. An id outside [0, Size()) decodes to
// utf8.RuneError.
func (v *Vocab) Decode(ids []int) string {
	var b strings.Builder
	b.Grow(len(ids))
	for _, id := range ids {
		if id < 0 || id >= len(v.runes) {
			b.WriteRune(utf8.RuneError)
			continue
		}
		b.WriteRune(v.runes[id])
	}
	return b.String()
}

// MarshalJSON encodes the vocabulary as a JSON string of its runes in id
// order.
func (v *Vocab) MarshalJSON() ([]byte, error) {
	return json.Marshal(string(v.runes))
}

// UnmarshalJSON decodes the form written by MarshalJSON.
func (v *Vocab) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("transformer: decoding vocabulary: %w", err)
	}
	nv, err := VocabFromRunes([]rune(s))
	if err != nil {
		return err
	}
	*v = *nv
	return nil
}
