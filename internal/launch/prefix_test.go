package launch

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// recorder keeps every Write as a separate chunk.
type recorder struct{ chunks []string }

func (r *recorder) Write(p []byte) (int, error) {
	r.chunks = append(r.chunks, string(p))
	return len(p), nil
}

func (r *recorder) String() string { return strings.Join(r.chunks, "") }

func writeAll(t *testing.T, w *PrefixWriter, parts ...string) {
	t.Helper()
	for _, p := range parts {
		n, err := w.Write([]byte(p))
		require.NoError(t, err)
		require.Equal(t, len(p), n)
	}
}

func TestPrefixWriterLines(t *testing.T) {
	for name, tc := range map[string]struct {
		parts  []string
		chunks []string // Writes seen by dst, after Flush
	}{
		"one line":       {[]string{"hello\n"}, []string{"[0] hello\n"}},
		"two lines":      {[]string{"a\nb\n"}, []string{"[0] a\n", "[0] b\n"}},
		"split line":     {[]string{"he", "ll", "o\nwor", "ld\n"}, []string{"[0] hello\n", "[0] world\n"}},
		"empty lines":    {[]string{"\n\n"}, []string{"[0] \n", "[0] \n"}},
		"partial at end": {[]string{"a\nrest"}, []string{"[0] a\n", "[0] rest\n"}},
		"empty write":    {[]string{"", "x\n", ""}, []string{"[0] x\n"}},
		"nothing":        {nil, nil},
		"carriage returns": {
			[]string{"\r 10%\r 20%\r 30%\n"},
			[]string{"[0] \r", "[0]  10%\r", "[0]  20%\r", "[0]  30%\n"},
		},
		"crlf":          {[]string{"a\r\nb\r\n"}, []string{"[0] a\r\n", "[0] b\r\n"}},
		"crlf split":    {[]string{"a\r", "\nb\n"}, []string{"[0] a\r", "\n", "[0] b\n"}},
		"cr then text":  {[]string{"a\r", "b\n"}, []string{"[0] a\r", "[0] b\n"}},
		"lf after lf":   {[]string{"a\n", "\n"}, []string{"[0] a\n", "[0] \n"}},
		"cr at the end": {[]string{"50%\r"}, []string{"[0] 50%\r"}},
	} {
		t.Run(name, func(t *testing.T) {
			var rec recorder
			w := NewPrefixWriter(&rec, "[0] ")
			writeAll(t, w, tc.parts...)
			require.NoError(t, w.Flush())
			assert.Equal(t, tc.chunks, rec.chunks)
		})
	}
}

func TestPrefixWriterHugeLine(t *testing.T) {
	var rec recorder
	w := NewPrefixWriter(&rec, "[7] ")
	huge := strings.Repeat("x", 5*maxPending+123)
	// Feed it in uneven pieces, then a normal line.
	for rest := huge; rest != ""; {
		n := min(len(rest), 100003)
		writeAll(t, w, rest[:n])
		rest = rest[n:]
	}
	writeAll(t, w, "\nnext\n")
	require.NoError(t, w.Flush())

	assert.Equal(t, "[7] "+huge+"\n[7] next\n", rec.String())
	for _, c := range rec.chunks {
		assert.LessOrEqual(t, len(c), maxPending+100003+len("[7] "), "held bytes stay bounded")
	}
	assert.Equal(t, 1, strings.Count(rec.String(), "[7] x"), "prefix only before the first piece")

	// A huge line without a newline is flushed with one.
	rec.chunks = nil
	writeAll(t, w, huge)
	require.NoError(t, w.Flush())
	assert.Equal(t, "[7] "+huge+"\n", rec.String())
}

func TestPrefixWriterHugeSingleWrite(t *testing.T) {
	var buf bytes.Buffer
	w := NewPrefixWriter(&buf, "[1] ")
	huge := strings.Repeat("y", 3*maxPending)
	writeAll(t, w, "a\n"+huge+"\nb\n")
	require.NoError(t, w.Flush())
	assert.Equal(t, "[1] a\n[1] "+huge+"\n[1] b\n", buf.String())
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	f.n++
	return 0, errors.New("broken pipe")
}

func TestPrefixWriterKeepsAcceptingAfterDstFails(t *testing.T) {
	f := &failWriter{}
	w := NewPrefixWriter(f, "[0] ")
	writeAll(t, w, "a\n", "b\n", "c")
	assert.Equal(t, 1, f.n, "no writes after the first failure")
	assert.EqualError(t, w.Flush(), "broken pipe")
}

func TestLenientWriter(t *testing.T) {
	f := &failWriter{}
	l := &lenientWriter{w: f}
	for range 3 {
		n, err := l.Write([]byte("abc"))
		require.NoError(t, err)
		require.Equal(t, 3, n)
	}
	assert.Equal(t, 1, f.n)
}
