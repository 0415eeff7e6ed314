package ent

// The generated code is committed. To regenerate it after changing the
// schema, run `go generate ./datalayer/ent/ent` in the examples module.
//go:generate go tool ent generate ./schema
