package releasetest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// Module is one module of the workspace.
type Module struct {
	Path string // module path
	Dir  string // absolute directory
	Rel  string // directory relative to the workspace root, "." for the root
	// Command reports that the module's root directory holds a main
	// package: users install it rather than import it.
	Command bool
}

// Published reports whether the module is released with a tag: every
// module of the workspace except those nobody imports, bench, examples and
// the ones under internal/ (as scripts/release.sh decides).
func (m Module) Published() bool {
	r := filepath.ToSlash(m.Rel)
	return r != "bench" && r != "examples" && !strings.HasPrefix(r, "bench/") && !strings.HasPrefix(r, "internal/") &&
		!strings.Contains(r, "/internal/")
}

// Workspace returns the modules of the go.work at root (`go list -m`).
func Workspace(root string) ([]Module, error) {
	cmd := exec.Command("go", "list", "-m", "-json")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(root, "go.work"))
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w", err)
	}
	var mods []Module
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var m struct{ Path, Dir string }
		if err := dec.Decode(&m); err != nil {
			return nil, err
		}
		rel, err := filepath.Rel(root, m.Dir)
		if err != nil {
			return nil, err
		}
		cmdMod, err := isCommand(m.Dir)
		if err != nil {
			return nil, err
		}
		mods = append(mods, Module{Path: m.Path, Dir: m.Dir, Rel: rel, Command: cmdMod})
	}
	return mods, nil
}

// isCommand reports whether dir's non-test Go files are package main.
func isCommand(dir string) (bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return false, err
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
		if err != nil {
			return false, err
		}
		return af.Name.Name == "main", nil
	}
	return false, nil
}

// SiblingVersion returns the one version at which the modules require each
// other. It is an error for two requirements to differ (scripts/release.sh
// bumps them together), for no module to require a sibling, or for a
// published module to have a replace directive.
func SiblingVersion(mods []Module) (string, error) {
	paths := map[string]bool{}
	for _, m := range mods {
		paths[m.Path] = true
	}
	version, from := "", ""
	for _, m := range mods {
		data, err := os.ReadFile(filepath.Join(m.Dir, "go.mod"))
		if err != nil {
			return "", err
		}
		f, err := modfile.Parse(filepath.Join(m.Dir, "go.mod"), data, nil)
		if err != nil {
			return "", err
		}
		if len(f.Replace) > 0 && m.Published() {
			// A user's build ignores them, and go install PATH@VERSION
			// refuses a module that has them: go.work does the wiring.
			return "", fmt.Errorf("%s/go.mod has a replace directive (%s): published modules must not", m.Rel, f.Replace[0].Old)
		}
		for _, r := range f.Require {
			if !paths[r.Mod.Path] {
				continue
			}
			if version != "" && r.Mod.Version != version {
				return "", fmt.Errorf("%s requires %s, but %s requires %s: run scripts/release.sh", m.Path, r.Mod, from, version)
			}
			version, from = r.Mod.Version, m.Path
		}
	}
	if version == "" {
		return "", fmt.Errorf("no module requires a sibling")
	}
	return version, nil
}

// WriteProxy lays out dir as a module proxy (the GOPROXY protocol over
// file://) serving each module at version: @v/list, .info, .mod and the
// module zip, made as the go command makes it (golang.org/x/mod/zip: no
// nested modules, no vendor directory, no VCS metadata).
func WriteProxy(dir, version string, mods []Module) error {
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	if err != nil {
		return err
	}
	for _, m := range mods {
		escaped, err := module.EscapePath(m.Path)
		if err != nil {
			return err
		}
		v := filepath.Join(dir, filepath.FromSlash(escaped), "@v")
		if err := os.MkdirAll(v, 0o755); err != nil {
			return err
		}
		gomod, err := os.ReadFile(filepath.Join(m.Dir, "go.mod"))
		if err != nil {
			return err
		}
		for name, data := range map[string][]byte{"list": []byte(version + "\n"), version + ".info": info, version + ".mod": gomod} {
			if err := os.WriteFile(filepath.Join(v, name), data, 0o644); err != nil {
				return err
			}
		}
		z, err := os.Create(filepath.Join(v, version+".zip"))
		if err != nil {
			return err
		}
		err = zip.CreateFromDir(z, module.Version{Path: m.Path, Version: version}, m.Dir)
		if cerr := z.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("zip %s: %w", m.Path, err)
		}
	}
	return nil
}
