package releasetest

import (
	"bufio"
	"fmt"
	"strings"
)

// Snippet is one ```go block of a Markdown file.
type Snippet struct {
	// Line is the line number, in the Markdown file, of the block's first
	// line of code (the line after the opening fence).
	Line int
	// Code is the block's text.
	Code string
}

// Snippets returns the ```go blocks of a Markdown document, in order. A
// block that is not closed is an error.
func Snippets(markdown string) ([]Snippet, error) {
	var (
		out   []Snippet
		cur   *Snippet
		lines []string
		fence string
	)
	sc := bufio.NewScanner(strings.NewReader(markdown))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && (trimmed == "```go" || trimmed == "~~~go"):
			cur, fence, lines = &Snippet{Line: n + 1}, trimmed[:3], nil
		case cur != nil && trimmed == fence:
			cur.Code = strings.Join(lines, "\n") + "\n"
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			lines = append(lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("the go block at line %d is not closed", cur.Line-1)
	}
	return out, nil
}

// File returns the Go source file that compiles s, by the package's
// convention: a block starting with a package clause is used as it is; any
// other is a fragment, whose leading imports stay at file level and whose
// statements become the body of func snippet(ctx context.Context), called
// from main. file names the Markdown file in the //line directives, so that
// compile errors point at it.
func (s Snippet) File(file string) string {
	lines := strings.Split(strings.TrimRight(s.Code, "\n"), "\n")
	first := 0
	for first < len(lines) && (strings.TrimSpace(lines[first]) == "" || strings.HasPrefix(strings.TrimSpace(lines[first]), "//")) {
		first++
	}
	if first < len(lines) && strings.HasPrefix(lines[first], "package ") {
		return fmt.Sprintf("//line %s:%d\n%s", file, s.Line, s.Code)
	}
	// The leading import declarations: single lines, or blocks up to ")".
	end := first
	for end < len(lines) {
		l := strings.TrimSpace(lines[end])
		switch {
		case l == "":
			end++
			continue
		case strings.HasPrefix(l, "import ("):
			for end < len(lines) && strings.TrimSpace(lines[end]) != ")" {
				end++
			}
			end++
			continue
		case strings.HasPrefix(l, "import "):
			end++
			continue
		}
		break
	}
	var b strings.Builder
	b.WriteString("package main\n\nimport snippetcontext \"context\"\n\n")
	if end > 0 {
		fmt.Fprintf(&b, "//line %s:%d\n%s\n", file, s.Line, strings.Join(lines[:end], "\n"))
	}
	b.WriteString("\nfunc main() { snippet(snippetcontext.Background()) }\n\n")
	b.WriteString("func snippet(ctx snippetcontext.Context) {\n")
	fmt.Fprintf(&b, "//line %s:%d\n%s\n}\n", file, s.Line+end, strings.Join(lines[end:], "\n"))
	return b.String()
}
