package docs

import (
	"bufio"
	"io"
	"net/url"
	"regexp"
	"strings"
)

// Link is one link or image of a Markdown file.
type Link struct {
	Line   int    // 1-based line number
	Text   string // the bracketed text (an image's alt text)
	Target string // as written, without the optional title
	Image  bool   // ![text](target)
}

var (
	// inline matches [text](target) and ![text](target); the target may
	// be followed by a quoted title.
	inline = regexp.MustCompile(`(!?)\[([^\]]*)\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+"[^"]*")?\s*\)`)
	// reference matches a reference definition: [label]: target
	reference = regexp.MustCompile(`^\s{0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)`)
	// codeSpan matches an inline code span.
	codeSpan = regexp.MustCompile("`+[^`]*`+")
)

// Links returns the links and images of the Markdown read from r, in
// order: inline links and images and reference definitions, outside fenced
// code blocks and code spans.
func Links(r io.Reader) ([]Link, error) {
	var links []Link
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	fence := "" // the fence that opened the current code block, if any
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if f := fenceOf(trimmed); f != "" {
			fence = f
			continue
		}
		if m := reference.FindStringSubmatch(line); m != nil {
			links = append(links, Link{Line: n, Text: m[1], Target: strings.Trim(m[2], "<>")})
			continue
		}
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range inline.FindAllStringSubmatch(line, -1) {
			links = append(links, Link{Line: n, Text: m[2], Target: strings.Trim(m[3], "<>"), Image: m[1] == "!"})
		}
	}
	return links, sc.Err()
}

// fenceOf returns the fence (``` or ~~~, as long as written) that line
// opens, or "".
func fenceOf(line string) string {
	for _, c := range []string{"`", "~"} {
		if strings.HasPrefix(line, c+c+c) {
			return line[:len(line)-len(strings.TrimLeft(line, c))]
		}
	}
	return ""
}

// IsRelative reports whether target names a file of the repository: not a
// URL with a scheme (http:, https:, mailto:, ...), not a pure #anchor and
// not an absolute path.
func IsRelative(target string) bool {
	if target == "" || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "/") {
		return false
	}
	u, err := url.Parse(target)
	return err == nil && u.Scheme == "" && u.Host == ""
}

// Path returns the file part of a relative target: without its #anchor or
// ?query, with %-escapes decoded.
func Path(target string) string {
	if i := strings.IndexAny(target, "#?"); i >= 0 {
		target = target[:i]
	}
	if p, err := url.PathUnescape(target); err == nil {
		return p
	}
	return target
}
