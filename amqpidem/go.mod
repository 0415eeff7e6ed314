module github.com/idemhq/idem/amqpidem

go 1.26.0

require (
	github.com/idemhq/idem v0.2.0
	github.com/idemhq/idem/outbox v0.2.0
)

require (
	github.com/dunglas/httpsfv v1.1.2 // indirect
	github.com/rabbitmq/amqp091-go v1.16.0
)
