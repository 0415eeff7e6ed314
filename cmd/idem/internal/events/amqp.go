package events

import (
	"context"
	"errors"
	"log/slog"
)

func dialAMQP(ctx context.Context, rawURL, subject string, logger *slog.Logger) (*Conn, error) {
	return nil, errors.New("events: amqp:// is not supported yet")
}
