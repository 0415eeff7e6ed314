module github.com/idemhq/idem

go 1.26.0

require github.com/dunglas/httpsfv v1.1.2

require go.uber.org/goleak v1.3.0
