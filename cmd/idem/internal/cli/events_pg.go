package cli

import (
	"context"
	"errors"

	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/outbox"
)

type addStore interface {
	outbox.Store
	Add(ctx context.Context, msgs ...outbox.Message) error
}

func newPGOutbox(ctx context.Context, db *backend.Store) (addStore, error) {
	return nil, errors.New("--events with a postgres:// --db is not supported yet")
}
