module github.com/idemhq/idem/natsidem

go 1.26.0

require (
	github.com/idemhq/idem v0.2.0
	github.com/idemhq/idem/outbox v0.2.0
	github.com/nats-io/nats.go v1.55.0
)

require (
	github.com/dunglas/httpsfv v1.1.2 // indirect
	github.com/klauspost/compress v1.20.0 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
