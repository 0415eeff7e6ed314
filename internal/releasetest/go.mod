module github.com/idemhq/idem/internal/releasetest

go 1.26.0

require golang.org/x/mod v0.42.0

require go.uber.org/goleak v1.3.0
