package idem

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// txHolder begins the operation's transaction on first use and hands it to
// the executor when the operation returns. A nil *txHolder (a store without
// transactions) holds nothing.
type txHolder struct {
	store   idemstore.TxStore
	ctx     context.Context
	timeout time.Duration

	mu     sync.Mutex
	tx     idemstore.Tx
	err    error
	closed bool
	cancel context.CancelCauseFunc // ends the context the transaction began with
	// claimed reports that tx holds the execution's uncommitted claim
	// (ClaimTx): it cannot be replaced by a new transaction.
	claimed bool
}

func (h *txHolder) get() (idemstore.Tx, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errTxClosed
	}
	if h.tx == nil && h.err == nil {
		h.tx, h.err = h.begin()
	}
	return h.tx, h.err
}

// begin calls BeginTx within the store timeout.
func (h *txHolder) begin() (idemstore.Tx, error) {
	var tx idemstore.Tx
	err := h.run(func(ctx context.Context) (err error) {
		tx, err = h.store.BeginTx(ctx)
		return err
	}, func() idemstore.Tx { return tx })
	if err != nil {
		return nil, fmt.Errorf("%w: begin: %w", ErrStoreUnavailable, err)
	}
	return tx, nil
}

// run calls start (BeginTx or ClaimTx) within the store timeout, and keeps
// the context the transaction began with, which must outlive the call
// (database/sql rolls a transaction back when its context ends): it is not
// a context with a deadline, but one that a timer cancels only if start
// has not returned in time, and that end cancels after the transaction is
// over. started returns the transaction start opened, if any.
func (h *txHolder) run(start func(context.Context) error, started func() idemstore.Tx) error {
	ctx, cancel := context.WithCancelCause(h.ctx)
	timer := time.AfterFunc(h.timeout, func() { cancel(context.DeadlineExceeded) })
	err := start(ctx)
	if !timer.Stop() && err == nil {
		if tx := started(); tx != nil {
			// The timeout fired as start returned: the transaction it
			// opened is already ending.
			rctx, rcancel := context.WithTimeout(h.ctx, h.timeout)
			_ = tx.Rollback(rctx)
			rcancel()
			err = context.DeadlineExceeded
		}
	}
	if err != nil {
		cancel(nil)
		return err
	}
	h.cancel = cancel
	return nil
}

// close returns the transaction, if one was begun, and refuses to begin
// one afterwards.
func (h *txHolder) close() idemstore.Tx {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return h.tx
}

// end releases the transaction's context once it was committed or rolled
// back.
func (h *txHolder) end() {
	if h != nil && h.cancel != nil {
		h.cancel(nil)
	}
}

func (h *txHolder) renewer() idemstore.TxRenewer {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	tr, _ := h.tx.(idemstore.TxRenewer)
	return tr
}
