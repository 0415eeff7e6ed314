// Package releasetest checks idem's modules as a user gets them: from a
// module proxy, at a version, with no go.work and no replace directive.
//
// TestInstallFromProxy builds every published module of the workspace (the
// modules of go.work except bench and internal/...) into a file-based module
// proxy at the version the modules require of each other, then, in a fresh
// module outside the repository (GOWORK=off, an empty module cache, the
// local proxy first and the real one for third-party modules), runs
//
//	go get <every library module>@VERSION
//	go build github.com/idemhq/idem/...          (every package of every module)
//	go build ./readme/...                        (the Go snippets of README.md)
//	go install <every command module>@VERSION    (github.com/idemhq/idem/cmd/idem)
//
// and runs the installed binary. A module added to go.work is included
// automatically.
//
// # README snippets
//
// Every ```go block of README.md must compile as written, by one convention
// (see Snippets):
//
//   - A block that starts with a package clause is a whole file.
//   - Any other block is a fragment: the import declarations it starts with,
//     then statements. The statements become the body of a function with
//     one parameter, ctx context.Context, so a fragment uses ctx without
//     declaring it. Every other name it uses must be imported or declared
//     in the block, and every variable it declares must be used.
//
// Compile errors point at README.md's lines (the generated files carry
// //line directives).
//
// This module is not published: it has no tag and no user imports it.
package releasetest
