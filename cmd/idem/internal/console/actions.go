package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/outbox"
)

// The record actions, by the path segment that names them.
var recordActions = map[string]struct {
	title, warning string
}{
	"delete": {"Delete this completed record",
		"The key becomes new again: a retry with it executes the operation a second time."},
	"release": {"Release this in-flight record",
		"Its lease ended: no live attempt owns it. Releasing deletes the record, and any recovery point with it: the next attempt with this key starts over, calling downstream systems again with the same derived keys. An attempt that is still running after all loses its lease and its result."},
	"reconcile": {"Reconcile this suspended payment now",
		"This process resumes the operation after its last completed step, now, as the background reconciler would: the provider is charged with the same derived key."},
}

// confirmData is a confirmation page.
type confirmData struct {
	Action, Title, Warning string
	Row                    *recordData
	Message                *outbox.PendingMessage
	Target                 string
	Fence                  int64
	Confirm                string
	Post                   string
	Back                   string
}

// allowed reports whether action applies to row, and why not.
func (c *Console) allowed(action string, row Row, now time.Time) error {
	switch action {
	case "delete":
		if row.State != idemstore.StateCompleted {
			return errors.New("only a completed record can be deleted here (release an in-flight one whose owner is gone)")
		}
	case "release":
		if !row.leaseEnded(now) {
			return errors.New("only an in-flight record whose lease ended can be released: an attempt owns this one")
		}
	case "reconcile":
		switch {
		case c.cfg.ReconcileFunc == nil:
			return errors.New("reconciling is possible only in idem serve --provider, whose code can resume the operation")
		case !row.suspended(now):
			return errors.New("only a record suspended after a step (its lease ended, a recovery point kept) can be reconciled")
		case row.Scope == "":
			return errors.New("this record's name is hashed: it cannot be resumed from here")
		}
	default:
		return errNoAction
	}
	return nil
}

var errNoAction = errors.New("no such action")

// confirmRecord shows what an action will do, with a form bound to the
// session, the record and its fence.
func (c *Console) confirmRecord(w http.ResponseWriter, r *http.Request, s session) {
	if _, err := query(r); err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err)
		return
	}
	action, id := r.PathValue("action"), r.PathValue("id")
	a, ok := recordActions[action]
	if !ok {
		c.fail(w, r, s, http.StatusNotFound, errNoAction)
		return
	}
	row, status, err := c.load(r.Context(), id)
	if err != nil {
		c.fail(w, r, s, status, err)
		return
	}
	now := c.cfg.NowFunc()
	if err := c.allowed(action, row, now); err != nil {
		c.fail(w, r, s, http.StatusConflict, err)
		return
	}
	d := c.detail(r.Context(), id, row, now)
	c.render(w, r, http.StatusOK, "confirm", s, confirmData{Action: action, Title: a.title, Warning: a.warning, Row: &d,
		Target: id, Fence: row.Fence, Confirm: c.confirmToken(s, action, id, row.Fence, now),
		Post: "/records/" + id + "/" + action, Back: "/records/" + id})
}

// actRecord runs a confirmed action and logs it.
func (c *Console) actRecord(w http.ResponseWriter, r *http.Request, s session) {
	action, id := r.PathValue("action"), r.PathValue("id")
	if _, ok := recordActions[action]; !ok {
		c.fail(w, r, s, http.StatusNotFound, errNoAction)
		return
	}
	now := c.cfg.NowFunc()
	fence, err := strconv.ParseInt(r.PostFormValue("fence"), 10, 64)
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, errors.New("the form has no fence: open the confirmation page again"))
		return
	}
	if err := c.checkConfirm(r.PostFormValue("confirm"), s, action, id, fence, now); err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err)
		return
	}
	ref, err := c.resolve(id)
	if err != nil {
		c.fail(w, r, s, http.StatusNotFound, err)
		return
	}
	if !c.beginAction(id) {
		c.fail(w, r, s, http.StatusConflict, errors.New("another action on this record is running (another tab?): nothing was done; open the record again to see how it ended"))
		return
	}
	defer c.endAction(id)
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	row, status, err := c.load(ctx, id)
	switch {
	case status == http.StatusNotFound:
		// The operator confirmed this record (the token says so): it
		// went since, most likely through the same action elsewhere.
		status, err = http.StatusConflict, errors.New("the record is gone since it was confirmed (deleted or released, perhaps from another tab, or expired): nothing was done")
	case err == nil:
		if err = c.allowed(action, row, now); err != nil {
			status = http.StatusConflict
			err = fmt.Errorf("the record changed since it was confirmed (perhaps from another tab): nothing was done: %w", err)
		}
	}
	if err == nil {
		switch action {
		case "delete":
			err = c.src.Delete(ctx, ref, fence, now)
		case "release":
			err = c.src.Release(ctx, ref, fence, now)
		case "reconcile":
			if row.Fence != fence {
				err = ErrChanged
			} else {
				// The operation runs as long as it needs (its own budget),
				// not as long as the page's store timeout.
				err = c.cfg.ReconcileFunc(context.WithoutCancel(r.Context()), row.Scope, row.Key)
			}
		}
		switch {
		case errors.Is(err, ErrChanged), errors.Is(err, idem.ErrInFlight):
			status = http.StatusConflict
		case errors.Is(err, idemstore.ErrNotFound):
			status, err = http.StatusConflict, errors.New("the record went while the action ran (deleted or released elsewhere, or expired): nothing was done")
		case err != nil:
			status = http.StatusServiceUnavailable
		}
	}
	err = redactKey(err, ref.Key)
	c.audit(r, s, action, ref, row, err)
	if err != nil {
		c.fail(w, r, s, status, fmt.Errorf("%s: %w", action, err))
		return
	}
	switch action {
	case "delete":
		c.render(w, r, http.StatusOK, "done", s, map[string]any{"Text": "The record was deleted: its key is new again.", "ID": id})
	case "release":
		http.Redirect(w, r, "/records?state=in-flight", http.StatusSeeOther)
	case "reconcile":
		http.Redirect(w, r, "/records/"+id+"?done=reconciled", http.StatusSeeOther)
	}
}

// beginAction marks an action as running on record id, and reports false
// when one already runs there; endAction ends it.
func (c *Console) beginAction(id string) bool {
	c.acting.Lock()
	defer c.acting.Unlock()
	if _, busy := c.acting.ids[id]; busy {
		return false
	}
	if c.acting.ids == nil {
		c.acting.ids = make(map[string]struct{})
	}
	c.acting.ids[id] = struct{}{}
	return true
}

func (c *Console) endAction(id string) {
	c.acting.Lock()
	defer c.acting.Unlock()
	delete(c.acting.ids, id)
}

// audit logs an action: who, what, when, on which record (the key
// redacted as idem logs keys), and how it ended.
func (c *Console) audit(r *http.Request, s session, action string, ref Ref, row Row, err error) {
	attrs := []slog.Attr{
		slog.String("who", s.who(r, c.token != "")),
		slog.String("action", action),
		slog.Time("when", c.cfg.NowFunc().UTC()),
		slog.String("record", r.PathValue("id")),
	}
	if ref.named() {
		attrs = append(attrs, slog.String("scope", ref.Scope), slog.String("key", idem.RedactKey(ref.Key)))
	} else {
		attrs = append(attrs, slog.String("store_id", ref.StoreID))
	}
	attrs = append(attrs, slog.Int64("fence", row.Fence))
	if err != nil {
		attrs = append(attrs, slog.String("result", "refused or failed"), slog.String("error", err.Error()))
		c.cfg.Logger.LogAttrs(r.Context(), slog.LevelWarn, "console: action", attrs...)
		return
	}
	attrs = append(attrs, slog.String("result", "done"))
	c.cfg.Logger.LogAttrs(r.Context(), slog.LevelInfo, "console: action", attrs...)
}

// parseSeq reads an outbox message's sequence number from the path.
func parseSeq(r *http.Request) (int64, error) {
	seq, err := strconv.ParseInt(r.PathValue("seq"), 10, 64)
	if err != nil || seq <= 0 {
		return 0, bad("%q is not a message sequence number", r.PathValue("seq"))
	}
	return seq, nil
}

// confirmRetry shows the retry of an outbox message.
func (c *Console) confirmRetry(w http.ResponseWriter, r *http.Request, s session) {
	if c.ob == nil {
		c.fail(w, r, s, http.StatusNotFound, errors.New("this store holds no outbox"))
		return
	}
	seq, err := parseSeq(r)
	if err == nil {
		_, err = query(r)
	}
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	m, err := c.ob.GetPending(ctx, seq)
	if errors.Is(err, outbox.ErrNotPending) {
		c.fail(w, r, s, http.StatusNotFound, errors.New("no unsent message has this number: it was sent"))
		return
	}
	if err != nil {
		c.storeFailed(w, r, s, err)
		return
	}
	if !c.cfg.ShowBody {
		m.Payload, m.Headers = nil, nil
	}
	target := "outbox:" + strconv.FormatInt(seq, 10)
	warning := "Any claim on the message ends now and the next dispatcher poll publishes it."
	if !m.ClaimedUntil.IsZero() {
		warning += " A dispatcher holds it until " + m.ClaimedUntil.Format(time.RFC3339) +
			": if it is publishing it right now, the message goes out twice with the same ID (JetStream and the inbox drop the copy)."
	}
	now := c.cfg.NowFunc()
	c.render(w, r, http.StatusOK, "confirm", s, confirmData{Action: "retry", Title: "Retry this outbox message now", Warning: warning,
		Message: &m, Target: target, Confirm: c.confirmToken(s, "retry", target, 0, now),
		Post: "/outbox/" + strconv.FormatInt(seq, 10) + "/retry", Back: "/outbox"})
}

// retry frees an outbox message's claim and wakes the dispatcher.
func (c *Console) retry(w http.ResponseWriter, r *http.Request, s session) {
	if c.ob == nil {
		c.fail(w, r, s, http.StatusNotFound, errors.New("this store holds no outbox"))
		return
	}
	seq, err := parseSeq(r)
	if err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err)
		return
	}
	target := "outbox:" + strconv.FormatInt(seq, 10)
	if err := c.checkConfirm(r.PostFormValue("confirm"), s, "retry", target, 0, c.cfg.NowFunc()); err != nil {
		c.fail(w, r, s, http.StatusBadRequest, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	err = c.ob.RetryNow(ctx, seq)
	attrs := []slog.Attr{slog.String("who", s.who(r, c.token != "")), slog.String("action", "retry outbox message"),
		slog.Time("when", c.cfg.NowFunc().UTC()), slog.Int64("seq", seq)}
	if err != nil {
		c.cfg.Logger.LogAttrs(r.Context(), slog.LevelWarn, "console: action", append(attrs, slog.String("result", "refused or failed"), slog.String("error", err.Error()))...)
		if errors.Is(err, outbox.ErrNotPending) {
			c.fail(w, r, s, http.StatusNotFound, errors.New("no unsent message has this number: it was sent meanwhile"))
			return
		}
		c.storeFailed(w, r, s, err)
		return
	}
	c.cfg.Logger.LogAttrs(r.Context(), slog.LevelInfo, "console: action", append(attrs, slog.String("result", "done"))...)
	if c.cfg.RetryNowFunc != nil {
		c.cfg.RetryNowFunc()
	}
	http.Redirect(w, r, "/outbox?done=retried", http.StatusSeeOther)
}
