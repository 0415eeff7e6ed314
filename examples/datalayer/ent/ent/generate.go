package ent

// The generated code is committed. To regenerate it after changing the
// schema, run `go generate ./examples/datalayer/ent/ent`.
//go:generate go tool ent generate ./schema
