package releasetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestInstallFromProxy is the package's test: see the package comment.
func TestInstallFromProxy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every module from a module proxy (about a minute); skipped with -short")
	}
	root := workspaceRoot(t)
	all, err := Workspace(root)
	if err != nil {
		t.Fatal(err)
	}
	var mods []Module
	for _, m := range all {
		if m.Published() {
			mods = append(mods, m)
		}
	}
	version, err := SiblingVersion(mods)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("modules at %s: %d published of %d", version, len(mods), len(all))

	tmp := t.TempDir()
	proxy := filepath.Join(tmp, "proxy")
	if err := WriteProxy(proxy, version, mods); err != nil {
		t.Fatal(err)
	}

	// The go command's own settings, before ours replace them.
	realProxy := goEnv(t, root, "GOPROXY")
	realCache := goEnv(t, root, "GOMODCACHE")

	user := filepath.Join(tmp, "user")
	bin := filepath.Join(tmp, "bin")
	writeFile(t, filepath.Join(user, "go.mod"), "module example.com/user\n\ngo 1.26.0\n")
	env := []string{
		"GOWORK=off",
		// A module cache of its own: the local v0.2.0 must never reach the
		// developer's cache, where it would shadow the real release.
		"GOMODCACHE=" + filepath.Join(tmp, "modcache"),
		// Our modules from the local proxy; third-party modules from the
		// developer's module cache (itself a proxy layout) when it has
		// them, else from the real proxy.
		"GOPROXY=file://" + filepath.ToSlash(proxy) + ",file://" + filepath.ToSlash(filepath.Join(realCache, "cache", "download")) + "," + realProxy,
		// The checksum database does not know local builds of our modules.
		"GONOSUMDB=github.com/idemhq/idem",
		"GOPRIVATE=", "GONOPROXY=",
		"GOBIN=" + bin,
		"GOTOOLCHAIN=local",
		// Without the module directory in the build cache's keys, the
		// packages of the temporary module cache are compiled once, not
		// in every run.
		"GOFLAGS=-mod=mod -trimpath",
	}
	run := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir = user
		cmd.Env = append(os.Environ(), env...)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("go %s (%s)", strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	}

	get := []string{"get"}
	var install []string
	for _, m := range mods {
		if m.Command {
			install = append(install, m.Path+"@"+version)
		} else {
			get = append(get, m.Path+"@"+version)
		}
	}
	run(get...)
	// Every package of every module, as resolved for a user.
	run("build", "github.com/idemhq/idem/...")

	// The README's snippets, compiled against the modules just fetched.
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	snippets, err := Snippets(string(readme))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	if len(snippets) == 0 {
		t.Fatal("README.md has no go block")
	}
	for i, s := range snippets {
		writeFile(t, filepath.Join(user, "readme", fmt.Sprintf("snippet%02d", i+1), "main.go"), s.File("README.md"))
	}
	run("build", "./readme/...")

	// go install PATH@VERSION ignores GOFLAGS' -mod (it builds the
	// module as its own main module).
	env = append(env, "GOFLAGS=-trimpath")
	for _, target := range install {
		run("install", target)
	}
	if len(install) == 0 {
		t.Fatal("no command module found (cmd/idem)")
	}
	idem := filepath.Join(bin, "idem")
	out, err := exec.CommandContext(t.Context(), idem, "serve", "--help").CombinedOutput()
	if !strings.Contains(string(out), "addr") {
		t.Fatalf("%s serve --help: %v\n%s", idem, err, out)
	}
}

// workspaceRoot returns the directory holding go.work, from the test's
// directory up.
func workspaceRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.work above %s", dir)
		}
	}
}

func goEnv(t *testing.T, dir, name string) string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "env", name)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go env %s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
