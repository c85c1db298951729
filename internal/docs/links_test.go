package docs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMarkdownLinks walks every *.md file of the repository (hidden
// directories such as .git and the ignored out/ directory left aside) and
// fails, naming file:line, for every relative link or image whose target
// does not exist.
func TestMarkdownLinks(t *testing.T) {
	root := repoRoot(t)
	var files, checked int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || path == filepath.Join(root, "out")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(d.Name(), ".md") {
			return nil
		}
		files++
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		links, err := Links(f)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, l := range links {
			if !IsRelative(l.Target) {
				continue
			}
			checked++
			target := filepath.Join(filepath.Dir(path), filepath.FromSlash(Path(l.Target)))
			if _, err := os.Stat(target); err != nil {
				kind := "link"
				if l.Image {
					kind = "image"
				}
				t.Errorf("%s:%d: %s %q: %v", rel, l.Line, kind, l.Target, err)
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.NotZero(t, files, "no Markdown file found under %s", root)
	t.Logf("%d Markdown files, %d relative links and images checked", files, checked)
}

// repoRoot returns the directory holding go.mod, walking up from the
// test's working directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		} else if !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test's directory")
		}
		dir = parent
	}
}

func TestLinks(t *testing.T) {
	md := strings.Join([]string{
		"# Title", // 1
		"See [the design](docs/design.md#layers) and ![a step](docs/step.png).", // 2
		"A [site](https://example.com), [mail](mailto:a@b.c), [here](#usage).",  // 3
		"`[not a link](code.md)` but [this](x.md \"title\") is.",                // 4
		"```go",                       // 5
		"m[i](x) // code, not a link", // 6
		"```",                         // 7
		"[ref]: BENCHMARKS.md",        // 8
		"[spaced](<my file.md>) and [escaped](my%20file.md)", // 9
	}, "\n")
	links, err := Links(strings.NewReader(md))
	require.NoError(t, err)
	var got []string
	for _, l := range links {
		s := l.Target
		if l.Image {
			s = "!" + s
		}
		got = append(got, s)
	}
	assert.Equal(t, []string{
		"docs/design.md#layers", "!docs/step.png",
		"https://example.com", "mailto:a@b.c", "#usage",
		"x.md",
		"BENCHMARKS.md",
		"my file.md", "my%20file.md",
	}, got)
	assert.Equal(t, 2, links[0].Line)
	assert.Equal(t, 8, links[6].Line)

	var rel []string
	for _, l := range links {
		if IsRelative(l.Target) {
			rel = append(rel, Path(l.Target))
		}
	}
	assert.Equal(t, []string{"docs/design.md", "docs/step.png", "x.md", "BENCHMARKS.md", "my file.md", "my file.md"}, rel)
}
