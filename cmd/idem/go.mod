module github.com/idemhq/idem/cmd/idem

go 1.25.0

require github.com/idemhq/idem v0.0.0

replace github.com/idemhq/idem => ../..
