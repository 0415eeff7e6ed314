package idem

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// unreadable reports a record whose response (what is "response") or
// recovery point (what is "recovery point") cannot be opened: logged as an
// error (the operator must restore a key or investigate tampering),
// observed as a store error with CodeRecordUnreadable, and returned as an
// error wrapping ErrRecordUnreadable.
func (e *Executor) unreadable(ctx context.Context, p DoParams, start time.Time, what string, err error) error {
	e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: stored "+what+" cannot be decrypted; answering 503 without executing",
		slog.String("operation", p.Operation), keyAttr(p.Key), slog.Any("error", err))
	e.emit(ctx, Event{Kind: EventStoreError, Operation: p.Operation, Status: http.StatusServiceUnavailable, Code: CodeRecordUnreadable, Err: err}, start)
	return err
}
