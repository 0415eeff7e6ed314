package releasetest

import (
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

func TestSnippets(t *testing.T) {
	t.Parallel()
	md := "# T\n\n```go\npackage main\n\nfunc main() {}\n```\n\ntext\n\n```sh\necho no\n```\n\n" +
		"```go\nimport (\n\t\"log\"\n)\n\nlog.Print(ctx)\n```\n\n```go\nimport \"fmt\"\nfmt.Println(1)\n```\n"
	got, err := Snippets(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("got %d snippets, want 3: %+v", len(got), got)
	}
	if got[0].Line != 4 || got[1].Line != 16 || got[2].Line != 24 {
		t.Errorf("lines %d %d %d, want 4 16 24", got[0].Line, got[1].Line, got[2].Line)
	}
	for i, s := range got {
		src := s.File("README.md")
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "x.go", src, parser.ParseComments)
		if err != nil {
			t.Fatalf("snippet %d does not parse: %v\n%s", i, err, src)
		}
		if f.Name.Name != "main" {
			t.Errorf("snippet %d: package %s", i, f.Name.Name)
		}
	}
	// A fragment's statements are reported at their README lines.
	src := got[1].File("README.md")
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	fn := f.Decls[len(f.Decls)-1]
	if pos := fset.Position(fn.End()); pos.Filename != "README.md" {
		t.Errorf("fragment body at %v, want README.md", pos)
	}
	if !strings.Contains(src, "func snippet(ctx snippetcontext.Context) {\n//line README.md:20\nlog.Print(ctx)") {
		t.Errorf("fragment wrapped as\n%s", src)
	}

	if _, err := Snippets("```go\nx := 1\n"); err == nil {
		t.Error("an unclosed block is not an error")
	}
}
