// Package docs checks the repository's Markdown: Links lists the links and
// images of a Markdown file, and the package's test fails for every
// relative link or image whose target does not exist.
//
// # Usage
//
//	links, err := docs.Links(f) // f: an open *.md file
//	for _, l := range links {
//		if docs.IsRelative(l.Target) {
//			// check filepath.Join(filepath.Dir(name), docs.Path(l.Target))
//		}
//	}
//
// or, for the whole repository:
//
//	go test ./internal/docs
package docs
