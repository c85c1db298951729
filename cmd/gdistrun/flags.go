package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// flagSet is a flag.FlagSet whose flags may have several spellings
// (gdistrun's own and torchrun's, e.g. -n, -nproc-per-node and
// -nproc_per_node). Go's flag package already takes one dash or two; every
// other spelling is a flag of its own sharing the first one's value. Two
// spellings of one flag given different values are an error.
type flagSet struct {
	*flag.FlagSet
	groups []*flagGroup          // in registration order
	byName map[string]*flagGroup // every spelling
}

// flagGroup is one flag and its spellings.
type flagGroup struct {
	names  []string   // names[0] is the one usage lists first
	value  flag.Value // the shared value
	usage  string
	setBy  string // spelling that set it last, "" if not set
	setVal string // the value it set
}

func newFlags(name string) *flagSet {
	return &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), byName: map[string]*flagGroup{}}
}

// add registers v under every name in names (the first is the main one).
// v should be one of package flag's own values (see stdValue), so that usage
// names its type.
func (fs *flagSet) add(v flag.Value, usage string, names ...string) {
	g := &flagGroup{names: names, value: v, usage: usage}
	fs.groups = append(fs.groups, g)
	for _, n := range names {
		fs.byName[n] = g
		fs.Var(&spelling{g: g, name: n}, n, usage)
	}
}

// set reports whether the flag with the given (main) name was given.
func (fs *flagSet) set(name string) bool { return fs.byName[name].setBy != "" }

// setBy returns the spelling that set the flag with the given name, with
// its dashes as usage shows them.
func (fs *flagSet) setBy(name string) string { return "-" + fs.byName[name].setBy }

// spelling is one name of a flagGroup, as registered with package flag.
type spelling struct {
	g    *flagGroup
	name string
}

func (s *spelling) String() string {
	if s == nil || s.g == nil {
		return ""
	}
	return s.g.value.String()
}

func (s *spelling) Set(v string) error {
	prev := s.g.value.String()
	if err := s.g.value.Set(v); err != nil {
		return err
	}
	now := s.g.value.String()
	if s.g.setBy != "" && s.g.setBy != s.name && s.g.setVal != now {
		conflict := fmt.Errorf("conflicts with -%s=%s", s.g.setBy, s.g.setVal)
		_ = s.g.value.Set(prev)
		return conflict
	}
	s.g.setBy, s.g.setVal = s.name, now
	return nil
}

// IsBoolFlag lets a boolean flag be given without a value.
func (s *spelling) IsBoolFlag() bool {
	b, ok := s.g.value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// printDefaults writes every flag once, its spellings on one line, in the
// format of flag.PrintDefaults.
func (fs *flagSet) printDefaults(w io.Writer) {
	for _, g := range fs.groups {
		f := fs.Lookup(g.names[0])
		typ, usage := flag.UnquoteUsage(&flag.Flag{Usage: g.usage, Value: g.value})
		var b strings.Builder
		for i, n := range g.names {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("-" + n)
		}
		if typ != "" {
			b.WriteString(" " + typ)
		}
		fmt.Fprintf(w, "  %s\n    \t%s", b.String(), strings.ReplaceAll(usage, "\n", "\n    \t"))
		if d := f.DefValue; d != "" && d != "0" && d != "false" && d != "0s" {
			if typ == "string" {
				d = fmt.Sprintf("%q", d)
			}
			fmt.Fprintf(w, " (default %s)", d)
		}
		fmt.Fprintln(w)
	}
}

// stdValue returns the flag.Value that reg registers under the name "v":
// one of package flag's own, for flagSet.add.
func stdValue(reg func(fs *flag.FlagSet)) flag.Value {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	reg(fs)
	return fs.Lookup("v").Value
}

func intValue(p *int, def int) flag.Value {
	return stdValue(func(fs *flag.FlagSet) { fs.IntVar(p, "v", def, "") })
}

func stringValue(p *string, def string) flag.Value {
	return stdValue(func(fs *flag.FlagSet) { fs.StringVar(p, "v", def, "") })
}

func boolValue(p *bool) flag.Value {
	return stdValue(func(fs *flag.FlagSet) { fs.BoolVar(p, "v", false, "") })
}

func durationValue(p *time.Duration, def time.Duration) flag.Value {
	return stdValue(func(fs *flag.FlagSet) { fs.DurationVar(p, "v", def, "") })
}

// nnodesValue is -nnodes: a node count N, or torchrun's range N:N. An
// elastic range M:N with M != N is refused: gdist jobs have a fixed size.
type nnodesValue struct{ n *int }

func (v nnodesValue) String() string { return intString(v.n, 1) }

// intString formats *p, or def if p is nil (flag's zero Value).
func intString(p *int, def int) string {
	if p == nil {
		return strconv.Itoa(def)
	}
	return strconv.Itoa(*p)
}

func (v nnodesValue) Set(s string) error {
	first, last, isRange := strings.Cut(s, ":")
	lo, err := strconv.Atoi(first)
	if err != nil {
		return fmt.Errorf("want a number of nodes N (or N:N), got %q", s)
	}
	if isRange {
		hi, err := strconv.Atoi(last)
		if err != nil {
			return fmt.Errorf("want a number of nodes N (or N:N), got %q", s)
		}
		if hi != lo {
			return fmt.Errorf("the elastic range %s is not supported: gdist jobs have a fixed size (every rank "+
				"joins at start, and a lost rank fails the job, which -max-restarts starts again); give one node count, e.g. %d or %d:%d",
				s, hi, hi, hi)
		}
	}
	*v.n = lo
	return nil
}

// streamsValue is torchrun's --redirects and --tee: 0 (none), 1 (stdout),
// 2 (stderr) or 3 (both). torchrun's per-rank form (0:1,1:2) is refused.
type streamsValue struct{ n *int }

func (v streamsValue) String() string { return intString(v.n, 0) }

func (v streamsValue) Set(s string) error {
	if strings.Contains(s, ":") {
		return fmt.Errorf("per-rank values (%s) are not supported: give one of 0, 1, 2, 3 for every rank", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > 3 {
		return fmt.Errorf("want 0 (none), 1 (stdout), 2 (stderr) or 3 (both), got %q", s)
	}
	*v.n = n
	return nil
}

// unknownFlag returns the first flag in args, before the program, that fs
// does not define, scanning as package flag parses ("" if none): so that
// the message can name it and suggest a spelling, where package flag says
// only "flag provided but not defined".
func (fs *flagSet) unknownFlag(args []string) string {
	for len(args) > 0 {
		a := args[0]
		args = args[1:]
		if len(a) < 2 || a[0] != '-' || a == "--" {
			return "" // the program, or the end of the flags
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		name, _, hasValue := strings.Cut(name, "=")
		f := fs.Lookup(name)
		if f == nil {
			if name == "h" || name == "help" {
				return ""
			}
			return name
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if !hasValue && len(args) > 0 {
			args = args[1:] // the flag's value
		}
	}
	return ""
}

// suggest returns the defined flag closest to name, at most two edits
// away, else the shortest that starts with name, or "".
func (fs *flagSet) suggest(name string) string {
	best, bestD := "", 3
	for n := range fs.byName {
		if d := editDistance(name, n); d < bestD || d == bestD && n < best {
			best, bestD = n, d
		}
	}
	if best != "" {
		return best
	}
	for n := range fs.byName {
		if strings.HasPrefix(n, name) && (best == "" || len(n) < len(best) || len(n) == len(best) && n < best) {
			best = n
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
