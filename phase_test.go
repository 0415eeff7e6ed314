package idem_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

// phaseLog records phases as "name" or "name!" (ended with an error).
type phaseLog struct {
	mu  sync.Mutex
	log []string
}

type phaseCtxKey struct{}

func (l *phaseLog) Observe(context.Context, idem.Event) {}

func (l *phaseLog) StartPhase(ctx context.Context, ph idem.Phase, info idem.PhaseInfo) (context.Context, func(error)) {
	if info.KeyHash != idem.RedactKey("k") || info.Operation != "op" {
		panic(fmt.Sprintf("phase info %+v", info))
	}
	return context.WithValue(ctx, phaseCtxKey{}, ph), func(err error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil {
			l.log = append(l.log, ph.String()+"!")
		} else {
			l.log = append(l.log, ph.String())
		}
	}
}

func (l *phaseLog) take() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.Join(l.log, " ")
	l.log = nil
	return s
}

func TestPhaseObserver(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	l := &phaseLog{}
	exec, err := idem.NewExecutor(store, &idem.Config{Observer: l})
	if err != nil {
		t.Fatal(err)
	}
	do := func(fp string, op idem.Operation) {
		t.Helper()
		_, _ = exec.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Fingerprint: fp, Operation: "op"}, op)
	}
	fail := func(context.Context) (*idem.Response, error) { return nil, errors.New("boom") }
	ok := func(ctx context.Context) (*idem.Response, error) {
		// The operation runs in the execute phase's context.
		if ph, _ := ctx.Value(phaseCtxKey{}).(idem.Phase); ph != idem.PhaseExecute {
			t.Errorf("operation context phase %v", ph)
		}
		return &idem.Response{StatusCode: 201}, nil
	}
	do("v1:a", fail)
	if got := l.take(); got != "claim execute! release" {
		t.Errorf("failed operation: %q", got)
	}
	do("v1:a", ok)
	if got := l.take(); got != "claim execute complete" {
		t.Errorf("execution: %q", got)
	}
	do("v1:a", ok)
	if got := l.take(); got != "claim replay" {
		t.Errorf("replay: %q", got)
	}
	do("v1:b", ok)
	if got := l.take(); got != "claim" {
		t.Errorf("mismatch: %q", got)
	}
}
