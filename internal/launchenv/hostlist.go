package launchenv

import (
	"fmt"
	"strconv"
	"strings"
)

// maxHosts bounds how many names ExpandHostlist produces, so that a
// malformed range such as node[0-999999999] cannot exhaust memory.
const maxHosts = 1 << 16

// ExpandHostlist expands a Slurm hostlist expression such as
// "node[01-04,07],login1" or "rack[1-2]-gpu[0-1]" into host names, in order.
// Ranges keep the zero padding of their lower bound ("node[08-10]" gives
// node08, node09, node10). Several bracket groups in one name expand to their
// product, leftmost slowest, as Slurm's scontrol show hostnames does.
func ExpandHostlist(s string) ([]string, error) {
	var out []string
	for _, item := range splitTop(s) {
		if item == "" {
			return nil, fmt.Errorf("%w: empty host in %q", ErrHostlist, s)
		}
		hosts, err := expandOne(item)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrHostlist, s, err)
		}
		if len(out)+len(hosts) > maxHosts {
			return nil, fmt.Errorf("%w: %q: more than %d hosts", ErrHostlist, s, maxHosts)
		}
		out = append(out, hosts...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no hosts in %q", ErrHostlist, s)
	}
	return out, nil
}

// FirstHost returns the first host of a Slurm hostlist expression.
func FirstHost(s string) (string, error) {
	// Expanding only the first item keeps a huge list cheap.
	items := splitTop(s)
	if len(items) == 0 || items[0] == "" {
		return "", fmt.Errorf("%w: no hosts in %q", ErrHostlist, s)
	}
	hosts, err := expandOne(items[0])
	if err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrHostlist, s, err)
	}
	return hosts[0], nil
}

// splitTop splits s at the commas outside brackets.
func splitTop(s string) []string {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	var items []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				items = append(items, s[start:i])
				start = i + 1
			}
		}
	}
	return append(items, s[start:])
}

// expandOne expands one host expression (no top-level commas).
func expandOne(item string) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.IndexByte(item, ']') >= 0 {
			return nil, fmt.Errorf("unbalanced ']'")
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("unbalanced '['")
	}
	end += open
	prefix, body, rest := item[:open], item[open+1:end], item[end+1:]
	if strings.IndexByte(prefix, ']') >= 0 || strings.IndexByte(body, '[') >= 0 {
		return nil, fmt.Errorf("nested or unbalanced brackets")
	}
	mids, err := expandRanges(body)
	if err != nil {
		return nil, err
	}
	tails, err := expandOne(rest)
	if rest == "" {
		tails, err = []string{""}, nil
	}
	if err != nil {
		return nil, err
	}
	if len(mids)*len(tails) > maxHosts {
		return nil, fmt.Errorf("more than %d hosts", maxHosts)
	}
	out := make([]string, 0, len(mids)*len(tails))
	for _, m := range mids {
		for _, t := range tails {
			out = append(out, prefix+m+t)
		}
	}
	return out, nil
}

// expandRanges expands the inside of a bracket: "01-04,07".
func expandRanges(body string) ([]string, error) {
	if body == "" {
		return nil, fmt.Errorf("empty brackets")
	}
	var out []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !digits(lo) || isRange && !digits(hi) {
			return nil, fmt.Errorf("bad range %q", r)
		}
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("bad range %q", r)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("bad range %q", r)
			}
		}
		if b < a {
			return nil, fmt.Errorf("descending range %q", r)
		}
		if b-a >= maxHosts || len(out)+b-a+1 > maxHosts {
			return nil, fmt.Errorf("more than %d hosts", maxHosts)
		}
		width := len(lo)
		for n := a; n <= b; n++ {
			out = append(out, fmt.Sprintf("%0*d", width, n))
		}
	}
	return out, nil
}

func digits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
