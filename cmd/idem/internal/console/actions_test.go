package console

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// find returns a key's record id, through the search form.
func (b *bundle) find(scope, key string) string {
	b.t.Helper()
	code, body, h := b.post("/search", url.Values{csrfField: {b.csrf()}, "key": {key}, "scope": {scope}})
	if code != http.StatusSeeOther {
		b.t.Fatalf("search %s = %d:\n%s", key, code, body)
	}
	return strings.TrimPrefix(h.Get("Location"), "/records/")
}

// act opens an action's confirmation page and confirms it.
func (b *bundle) act(id, action string) (int, string) {
	b.t.Helper()
	code, body, _ := b.get("/records/" + id + "/" + action)
	if code != http.StatusOK {
		return code, body
	}
	form := url.Values{csrfField: {field(b.t, csrfRE, body)}, "confirm": {field(b.t, confirmRE, body)}, "fence": {field(b.t, fenceRE, body)}}
	code, body, _ = b.post("/records/"+id+"/"+action, form)
	return code, body
}

// Every action needs its confirmation page's token, re-checks the record
// and is logged with who, what and when, the key redacted.
func TestActions(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.open(t)
			sd := seed(t, s, 2)
			b := setup(t, s, nil)
			done := b.find(sd.scope, sd.completed[0])
			live := b.find(sd.scope, sd.live)
			gone := b.find(sd.scope, sd.gone)
			if done != RecordID(sd.scope, sd.completed[0]) {
				t.Fatalf("the record's id is %s, want RecordID", done)
			}

			// No confirmation: refused, the record stays.
			code, _, _ := b.post("/records/"+done+"/delete", url.Values{csrfField: {b.csrf()}, "fence": {"0"}})
			if code != http.StatusBadRequest {
				t.Errorf("delete without confirming = %d, want 400", code)
			}
			if code, _, _ := b.get("/records/" + done); code != http.StatusOK {
				t.Fatalf("the record is gone after an unconfirmed delete: %d", code)
			}
			// A confirmation for another record or action does not count.
			_, page, _ := b.get("/records/" + done + "/delete")
			other := url.Values{csrfField: {field(t, csrfRE, page)}, "confirm": {field(t, confirmRE, page)}, "fence": {field(t, fenceRE, page)}}
			if code, _, _ := b.post("/records/"+gone+"/release", other); code != http.StatusBadRequest {
				t.Errorf("release with delete's confirmation = %d, want 400", code)
			}

			// The actions that do not apply are refused.
			if code, _ := b.act(live, "delete"); code != http.StatusConflict {
				t.Errorf("delete of an in-flight record = %d, want 409", code)
			}
			if code, _ := b.act(live, "release"); code != http.StatusConflict {
				t.Errorf("release of a live lease = %d, want 409", code)
			}
			if code, _ := b.act(done, "reconcile"); code != http.StatusConflict {
				t.Errorf("reconcile outside serve = %d, want 409", code)
			}

			// Delete, confirmed.
			if code, body := b.act(done, "delete"); code != http.StatusOK || !strings.Contains(body, "deleted") {
				t.Fatalf("confirmed delete = %d:\n%s", code, body)
			}
			if code, _, _ := b.get("/records/" + done); code != http.StatusNotFound {
				t.Errorf("the deleted record's page = %d, want 404", code)
			}
			// Release, confirmed.
			if code, body := b.act(gone, "release"); code != http.StatusSeeOther {
				t.Fatalf("confirmed release = %d:\n%s", code, body)
			}
			if code, _, _ := b.get("/records/" + gone); code != http.StatusNotFound {
				t.Errorf("the released record's page = %d, want 404", code)
			}
			log := b.log.String()
			for _, want := range []string{"action=delete", "action=release", "result=done", "when=", "who=\"session ", "key=sha256:"} {
				if !strings.Contains(log, want) {
					t.Errorf("the audit log lacks %q:\n%s", want, log)
				}
			}
			for _, key := range []string{sd.completed[0], sd.gone} {
				if strings.Contains(log, "key="+key) || strings.Contains(log, `key="`+key) {
					t.Errorf("the audit log holds the key %q in clear:\n%s", key, log)
				}
			}
		})
	}
}

// A record that changed between the confirmation and the action (deleted
// and claimed again: another fence) is not touched.
func TestActionOnChangedRecord(t *testing.T) {
	t.Parallel()
	for _, be := range backends[:2] { // the stores with fences on the record page
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.open(t)
			sd := seed(t, s, 1)
			b := setup(t, s, nil)
			id := b.find(sd.scope, sd.completed[0])
			_, page, _ := b.get("/records/" + id + "/delete")
			form := url.Values{csrfField: {field(t, csrfRE, page)}, "confirm": {field(t, confirmRE, page)}, "fence": {field(t, fenceRE, page)}}
			ctx := context.Background()
			in := s.Records.(idemstore.Inspector)
			if err := in.Delete(ctx, idemstore.DeleteParams{Scope: sd.scope, Key: sd.completed[0], Now: time.Now()}); err != nil {
				t.Fatal(err)
			}
			exec, _ := idem.NewExecutor(s.Records, nil)
			if _, err := exec.Do(ctx, idem.DoParams{Scope: sd.scope, Key: sd.completed[0], Fingerprint: "v1:fp"}, func(context.Context) (*idem.Response, error) {
				return &idem.Response{StatusCode: 200}, nil
			}); err != nil {
				t.Fatal(err)
			}
			if code, body, _ := b.post("/records/"+id+"/delete", form); code != http.StatusConflict {
				t.Fatalf("delete of a record claimed again since = %d, want 409:\n%s", code, body)
			}
			if _, err := in.Get(ctx, idemstore.GetParams{Scope: sd.scope, Key: sd.completed[0], Now: time.Now()}); err != nil {
				t.Fatalf("the new record was deleted: %v", err)
			}
		})
	}
}

// confirmForm opens an action's confirmation page, as a tab does, and
// returns the form it would post.
func (b *bundle) confirmForm(id, action string) url.Values {
	b.t.Helper()
	code, page, _ := b.get("/records/" + id + "/" + action)
	if code != http.StatusOK {
		b.t.Fatalf("the %s confirmation = %d:\n%s", action, code, page)
	}
	return url.Values{csrfField: {field(b.t, csrfRE, page)}, "confirm": {field(b.t, confirmRE, page)}, "fence": {field(b.t, fenceRE, page)}}
}

// A delete confirmed in two tabs and sent by both at once: one deletes,
// the other answers 409 saying that nothing was done, on every store.
func TestActionTwiceAtOnce(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.open(t)
			sd := seed(t, s, 1)
			b := setup(t, s, nil)
			id := b.find(sd.scope, sd.completed[0])
			tabs := []url.Values{b.confirmForm(id, "delete"), b.confirmForm(id, "delete")}
			type answer struct {
				code int
				body string
			}
			answers := make(chan answer, len(tabs))
			start := make(chan struct{})
			var wg sync.WaitGroup
			for _, form := range tabs {
				wg.Go(func() {
					<-start
					code, body, _ := b.post("/records/"+id+"/delete", form)
					answers <- answer{code, body}
				})
			}
			close(start)
			wg.Wait()
			close(answers)
			var ok, conflict int
			for a := range answers {
				switch a.code {
				case http.StatusOK:
					ok++
				case http.StatusConflict:
					conflict++
					if !strings.Contains(a.body, "nothing was done") {
						t.Errorf("the 409 does not say that nothing was done:\n%s", a.body)
					}
				default:
					t.Errorf("a delete answered %d:\n%s", a.code, a.body)
				}
			}
			if ok != 1 || conflict != 1 {
				t.Errorf("%d deletes succeeded and %d answered 409, want 1 and 1", ok, conflict)
			}
			if code, _, _ := b.get("/records/" + id); code != http.StatusNotFound {
				t.Errorf("the record's page after the deletes = %d, want 404", code)
			}
			if n := strings.Count(b.log.String(), "result=done"); n != 1 {
				t.Errorf("%d actions logged as done, want 1:\n%s", n, b.log.String())
			}
		})
	}
}

// A reconcile sent while the same record's reconcile still runs (a second
// tab) is refused with 409 at once: the operation is resumed once.
func TestReconcileTwiceAtOnce(t *testing.T) {
	t.Parallel()
	s := backends[0].open(t) // SQLite: a step store
	sd := seed(t, s, 1)
	var calls atomic.Int32
	entered, finish := make(chan struct{}), make(chan struct{})
	b := setup(t, s, func(cfg *Config) {
		cfg.ReconcileFunc = func(ctx context.Context, scope, key string) error {
			if calls.Add(1) == 1 {
				close(entered)
				<-finish
			}
			return nil
		}
	})
	id := b.find(sd.scope, sd.susp)
	first, second := b.confirmForm(id, "reconcile"), b.confirmForm(id, "reconcile")
	done := make(chan int, 1)
	go func() {
		code, _, _ := b.post("/records/"+id+"/reconcile", first)
		done <- code
	}()
	<-entered
	code, body, _ := b.post("/records/"+id+"/reconcile", second)
	close(finish)
	if code != http.StatusConflict || !strings.Contains(body, "another action on this record is running") {
		t.Errorf("the second reconcile = %d, want 409 naming the running action:\n%s", code, body)
	}
	if code := <-done; code != http.StatusSeeOther {
		t.Errorf("the first reconcile = %d, want 303", code)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the operation was resumed %d times, want 1", n)
	}
	// The record is free again: a later action is not refused as running.
	if code, body := b.act(id, "reconcile"); code != http.StatusSeeOther || calls.Load() != 2 {
		t.Errorf("a later reconcile = %d (resumed %d times in all), want 303 and 2:\n%s", code, calls.Load(), body)
	}
}
