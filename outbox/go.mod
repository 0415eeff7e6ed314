module github.com/idemhq/idem/outbox

go 1.26.0
