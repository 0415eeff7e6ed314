module github.com/idemhq/idem/mysqlstore

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.10.1
	github.com/idemhq/idem v0.2.0
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/dunglas/httpsfv v1.1.2 // indirect
)
