package releasetest

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// API returns the exported surface of every package of the published,
// importable modules of the workspace at root, one sorted line per name,
// in the form of the Go tree's api/ files:
//
//	pkg github.com/idemhq/idem, func Scope(string, string) string
//	pkg github.com/idemhq/idem, type Config struct, Lease time.Duration
//	pkg github.com/idemhq/idem/idemstore, method (*Response) MarshalBinary() ([]byte, error)
//
// Commands, examples, internal packages and test files are left out. It
// reads the source only (go/parser), so that it needs no build.
func API(root string) ([]string, error) {
	mods, err := Workspace(root)
	if err != nil {
		return nil, err
	}
	var lines []string
	for _, m := range mods {
		if !m.Published() || m.Command {
			continue
		}
		ls, err := moduleAPI(m, mods)
		if err != nil {
			return nil, err
		}
		lines = append(lines, ls...)
	}
	slices.Sort(lines)
	return slices.Compact(lines), nil
}

// moduleAPI walks the packages of m, skipping directories that belong to
// another module of mods.
func moduleAPI(m Module, mods []Module) ([]string, error) {
	var lines []string
	err := filepath.WalkDir(m.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		name := d.Name()
		if p != m.Dir && (name == "testdata" || name == "internal" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
			return filepath.SkipDir
		}
		for _, o := range mods {
			if o.Dir == p && o.Dir != m.Dir {
				return filepath.SkipDir
			}
		}
		rel, err := filepath.Rel(m.Dir, p)
		if err != nil {
			return err
		}
		ls, err := packageAPI(p, path.Join(m.Path, filepath.ToSlash(rel)))
		lines = append(lines, ls...)
		return err
	})
	return lines, err
}

// packageAPI lists the exported names of the package in dir, if it holds
// one that is not a command.
func packageAPI(dir, importPath string) ([]string, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		if f.Name.Name == "main" {
			return nil, nil
		}
		files = append(files, f)
	}
	w := apiWriter{fset: fset, prefix: "pkg " + importPath + ", "}
	for _, f := range files {
		for _, d := range f.Decls {
			w.decl(d)
		}
	}
	return w.lines, nil
}

type apiWriter struct {
	fset   *token.FileSet
	prefix string
	lines  []string
}

func (w *apiWriter) add(format string, args ...any) {
	w.lines = append(w.lines, w.prefix+fmt.Sprintf(format, args...))
}

// expr prints an expression on one line.
func (w *apiWriter) expr(e ast.Node) string {
	var b bytes.Buffer
	_ = printer.Fprint(&b, w.fset, e)
	return strings.Join(strings.Fields(b.String()), " ")
}

// signature prints a function type without the word func, and without
// parameter names: renaming a parameter is not an API change.
func (w *apiWriter) signature(t *ast.FuncType) string {
	list := func(fl *ast.FieldList) []string {
		var out []string
		if fl == nil {
			return nil
		}
		for _, f := range fl.List {
			n := max(len(f.Names), 1)
			for range n {
				out = append(out, w.expr(f.Type))
			}
		}
		return out
	}
	tparams := ""
	if t.TypeParams != nil {
		var ps []string
		for _, f := range t.TypeParams.List {
			for _, n := range f.Names {
				ps = append(ps, n.Name+" "+w.expr(f.Type))
			}
		}
		tparams = "[" + strings.Join(ps, ", ") + "]"
	}
	s := tparams + "(" + strings.Join(list(t.Params), ", ") + ")"
	switch res := list(t.Results); len(res) {
	case 0:
	case 1:
		s += " " + res[0]
	default:
		s += " (" + strings.Join(res, ", ") + ")"
	}
	return s
}

func (w *apiWriter) decl(d ast.Decl) {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if !d.Name.IsExported() {
			return
		}
		if d.Recv == nil {
			w.add("func %s%s", d.Name.Name, w.signature(d.Type))
			return
		}
		recv := d.Recv.List[0].Type
		base := recv
		if s, ok := base.(*ast.StarExpr); ok {
			base = s.X
		}
		if ix, ok := base.(*ast.IndexExpr); ok {
			base = ix.X
		}
		if id, ok := base.(*ast.Ident); ok && id.IsExported() {
			w.add("method (%s) %s%s", w.expr(recv), d.Name.Name, w.signature(d.Type))
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				w.typeSpec(s)
			case *ast.ValueSpec:
				for _, n := range s.Names {
					if n.IsExported() {
						w.add("%s %s", d.Tok, n.Name)
					}
				}
			}
		}
	}
}

func (w *apiWriter) typeSpec(s *ast.TypeSpec) {
	if !s.Name.IsExported() {
		return
	}
	name := s.Name.Name
	if s.Assign.IsValid() {
		w.add("type %s = %s", name, w.expr(s.Type))
		return
	}
	switch t := s.Type.(type) {
	case *ast.StructType:
		w.add("type %s struct", name)
		for _, f := range t.Fields.List {
			if len(f.Names) == 0 {
				w.add("type %s struct, embedded %s", name, w.expr(f.Type))
			}
			for _, n := range f.Names {
				if n.IsExported() {
					w.add("type %s struct, %s %s", name, n.Name, w.expr(f.Type))
				}
			}
		}
	case *ast.InterfaceType:
		w.add("type %s interface", name)
		for _, m := range t.Methods.List {
			if ft, ok := m.Type.(*ast.FuncType); ok && len(m.Names) > 0 {
				w.add("type %s interface, %s%s", name, m.Names[0].Name, w.signature(ft))
			} else {
				w.add("type %s interface, embedded %s", name, w.expr(m.Type))
			}
		}
	default:
		w.add("type %s %s", name, w.expr(s.Type))
	}
}
