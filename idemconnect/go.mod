module github.com/idemhq/idem/idemconnect

go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/idemhq/idem v0.2.0
	go.uber.org/goleak v1.3.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1
	google.golang.org/protobuf v1.36.12
)

require github.com/dunglas/httpsfv v1.1.2 // indirect
