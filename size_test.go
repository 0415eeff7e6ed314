package idem

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/idemhq/idem/memstore"
)

// TestExecutionSizeClass checks the bound in execution's comment: past 632
// bytes (640 with the runtime's header), every first execution allocates
// a larger size class.
func TestExecutionSizeClass(t *testing.T) {
	t.Parallel()
	if n := unsafe.Sizeof(execution{}); n > 632 {
		t.Fatalf("execution is %d bytes, want at most 632", n)
	}
}

// TestExchangeSizeClass checks the bound in httpExchange's comment: past
// 760 bytes (768 with the runtime's header), every protected request
// allocates the next size class, 896 bytes.
func TestExchangeSizeClass(t *testing.T) {
	t.Parallel()
	if n := unsafe.Sizeof(httpExchange{}); n > 760 {
		t.Fatalf("httpExchange is %d bytes, want at most 760", n)
	}
}

// TestRoomSharedByBodies checks that the request body and the recorded
// response, which share httpExchange.room, never overwrite each other:
// the handler answers before it reads the request, and the stored response
// replays intact.
func TestRoomSharedByBodies(t *testing.T) {
	t.Parallel()
	m := newMemMiddleware(t)
	reqBody := strings.Repeat("q", 100)
	// Longer than what is left of the room after the request: the
	// recorder's buffer grows out of it.
	for _, n := range []int{200, roomSize} {
		respBody := strings.Repeat("r", n)
		h := m.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, respBody)
			got, _ := io.ReadAll(r.Body)
			if string(got) != reqBody {
				t.Errorf("handler read %q, want %q", got, reqBody)
			}
		}))
		for i := range 2 {
			req := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(reqBody))
			req.Header.Set(HeaderKey, `"k`+strconv.Itoa(n)+`"`)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 200 || w.Body.String() != respBody {
				t.Fatalf("response %d of %d bytes: status %d, body %q", i, n, w.Code, w.Body.String())
			}
		}
	}
}

// newMemMiddleware returns a Middleware with the default Config on a new
// memstore.
func newMemMiddleware(t *testing.T) *Middleware {
	t.Helper()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMiddleware(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
