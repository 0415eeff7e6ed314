module github.com/idemhq/idem/idemecho

go 1.26.0

require (
	github.com/idemhq/idem v0.2.0
	github.com/labstack/echo/v5 v5.4.6
	go.uber.org/goleak v1.3.0
)

require github.com/dunglas/httpsfv v1.1.2 // indirect
