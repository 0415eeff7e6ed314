package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
)

// paymentBody returns a valid payment request.
func paymentBody(amountCents int, reference string) string {
	return fmt.Sprintf(`{"amountCents":%d,"currency":"USD","reference":%q}`, amountCents, reference)
}

// reply is a response as the tests examine it.
type reply struct {
	from   string // the name of the instance that answered
	status int
	header http.Header
	body   []byte
}

func (r reply) replayed() string { return r.header.Get(idem.HeaderReplayed) }

func (r reply) String() string {
	return fmt.Sprintf("%s: %d (%s: %q) %s", r.from, r.status, idem.HeaderReplayed, r.replayed(), bytes.TrimSpace(r.body))
}

// problemCode returns the "code" member of a problem+json body, or "" if
// the reply is not one.
func (r reply) problemCode() string {
	if r.header.Get("Content-Type") != "application/problem+json" {
		return ""
	}
	var p struct{ Code string }
	if json.Unmarshal(r.body, &p) != nil {
		return ""
	}
	return p.Code
}

// paymentID returns the id of the payment in a 201 reply.
func (r reply) paymentID(t *testing.T) string {
	t.Helper()
	var p struct{ ID string }
	if err := json.Unmarshal(r.body, &p); err != nil || p.ID == "" {
		t.Fatalf("no payment id in %v (%v)", r, err)
	}
	return p.ID
}

// pay POSTs a payment to s with the Idempotency-Key key through c. hdr is
// a list of further header name, value pairs.
func pay(c *http.Client, s *server, key, body string, hdr ...string) (reply, error) {
	req, err := http.NewRequest(http.MethodPost, s.url+"/api/payments", strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, idem.FormatKey(key))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("POST %s: %w", s.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("POST %s: read body: %w", s.name, err)
	}
	return reply{from: s.name, status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// mustPay is pay through the shared client, failing the test on a
// transport error.
func mustPay(t *testing.T, s *server, key, body string, hdr ...string) reply {
	t.Helper()
	r, err := pay(httpClient, s, key, body, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// get GETs path from s.
func get(t *testing.T, s *server, path string, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", s.name, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s%s: %v", s.name, path, err)
	}
	return reply{from: s.name, status: resp.StatusCode, header: resp.Header, body: b}
}

// apiCount returns GET /api/payments/count from s.
func apiCount(t *testing.T, s *server) int64 {
	t.Helper()
	r := get(t, s, "/api/payments/count")
	var c struct{ Count *int64 }
	if r.status != http.StatusOK || json.Unmarshal(r.body, &c) != nil || c.Count == nil {
		t.Fatalf("GET /api/payments/count: %v", r)
	}
	return *c.Count
}

// rawPay sends a payment request over a fresh TCP connection and returns
// the response exactly as received, minus its Date field: the form in
// which replays from different instances must be byte-identical.
func rawPay(t *testing.T, s *server, key, body string, hdr ...string) []byte {
	t.Helper()
	conn, err := net.DialTimeout("tcp", s.addr, 10*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", s.name, err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(60 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "POST /api/payments HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n", s.addr)
	fmt.Fprintf(&req, "%s: %s\r\n", idem.HeaderKey, idem.FormatKey(key))
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(&req, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	fmt.Fprintf(&req, "Content-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		t.Fatalf("write to %s: %v", s.name, err)
	}
	// The server closes the connection after the response (Connection:
	// close), so the whole response is everything up to EOF.
	resp, err := io.ReadAll(io.LimitReader(conn, 1<<20))
	if err != nil {
		t.Fatalf("read from %s: %v", s.name, err)
	}
	head, rest, ok := bytes.Cut(resp, []byte("\r\n\r\n"))
	if !ok {
		t.Fatalf("%s: incomplete response %q", s.name, resp)
	}
	var out bytes.Buffer
	dates := 0
	for _, line := range bytes.Split(head, []byte("\r\n")) {
		if len(line) > 5 && strings.EqualFold(string(line[:5]), "date:") {
			dates++
			continue
		}
		out.Write(line)
		out.WriteString("\r\n")
	}
	if dates != 1 {
		t.Fatalf("%s: %d Date fields in %q", s.name, dates, head)
	}
	out.WriteString("\r\n")
	out.Write(rest)
	return out.Bytes()
}

// parseRaw parses a response returned by rawPay.
func parseRaw(t *testing.T, from string, raw []byte) reply {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
	if err != nil {
		t.Fatalf("%s: parse %q: %v", from, raw, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: parse %q: %v", from, raw, err)
	}
	return reply{from: from, status: resp.StatusCode, header: resp.Header, body: b}
}

// burst sends n copies of one payment request (same key, same body) at
// once, round-robin over servers. Each request has its own connection,
// opened beforehand, and all are released together, so that they reach
// the instances as close to simultaneously as the machine allows.
func burst(t *testing.T, servers []*server, n int, key, body string) []reply {
	t.Helper()
	replies := make([]reply, n)
	errs := make([]error, n)
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		s := servers[i%len(servers)]
		tr := &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}
		c := &http.Client{Transport: tr, Timeout: 60 * time.Second}
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			defer tr.CloseIdleConnections()
			// Open the connection now; the request below reuses it.
			resp, err := c.Get(s.url + "/healthz")
			if err == nil {
				drain(resp)
			}
			ready.Done()
			<-start
			if err != nil {
				errs[i] = fmt.Errorf("warm-up GET %s/healthz: %w", s.name, err)
				return
			}
			replies[i], errs[i] = pay(c, s, key, body)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return replies
}

// checkBurst checks the replies of a burst of duplicates against the
// contract for duplicates that overlap one execution: exactly one reply is
// the execution (201, Idempotency-Replayed: false), every other 201 is a
// replay of the same bytes, every other reply is 409
// idempotency.request_in_progress with Retry-After; every instance
// answered at least one 409 (so the duplicates really met an operation
// running on some instance); and the instances executed the operation
// once in total, by their idem_executions_total counters. (The payments
// table's unique (tenant, key) constraint would hide a second execution
// from a row count: the counters and the replies do not.) It returns the
// executed reply.
func checkBurst(t *testing.T, servers []*server, replies []reply) reply {
	t.Helper()
	var executed []reply
	conflicts := map[string]int{}
	replays := 0
	for _, r := range replies {
		switch {
		case r.status == http.StatusCreated && r.replayed() == "false":
			executed = append(executed, r)
		case r.status == http.StatusCreated && r.replayed() == "true":
			replays++
		case r.status == http.StatusConflict && r.problemCode() == idem.CodeRequestInProgress:
			if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra <= 0 {
				t.Errorf("409 without a positive Retry-After: %v %v", r, r.header)
			}
			conflicts[r.from]++
		default:
			t.Errorf("unexpected reply to a duplicate: %v", r)
		}
	}
	if len(executed) != 1 {
		t.Fatalf("%d replies were executions (201, %s: false), want exactly 1: %v", len(executed), idem.HeaderReplayed, executed)
	}
	for _, r := range replies {
		if r.status == http.StatusCreated && !bytes.Equal(r.body, executed[0].body) {
			t.Errorf("201 bodies differ:\n%s\n%s", executed[0].body, r.body)
		}
	}
	for _, s := range servers {
		if conflicts[s.name] == 0 {
			t.Errorf("%s answered no 409: the duplicates did not overlap the running operation (conflicts %v, replays %d)", s.name, conflicts, replays)
		}
	}
	var total float64
	for _, s := range servers {
		total += s.mustMetric(t, "idem_executions_total")
	}
	if total != 1 {
		t.Errorf("the instances executed the operation %v times in total, want 1", total)
	}
	t.Logf("%d duplicates over %d instances: 1 execution on %s, 409s %v, %d replays", len(replies), len(servers), executed[0].from, conflicts, replays)
	return executed[0]
}

// checkReplay checks that replay is a replay of original: the same status
// and body, and the same header fields except Date and
// Idempotency-Replayed (true on the replay).
func checkReplay(t *testing.T, original, replay reply) {
	t.Helper()
	if replay.status != original.status || !bytes.Equal(replay.body, original.body) {
		t.Errorf("replay from %s differs from the original (%s):\n%v\n%v", replay.from, original.from, original, replay)
	}
	if replay.replayed() != "true" {
		t.Errorf("replay from %s: %s = %q, want true", replay.from, idem.HeaderReplayed, replay.replayed())
	}
	strip := func(h http.Header) http.Header {
		h = h.Clone()
		h.Del("Date")
		h.Del(idem.HeaderReplayed)
		return h
	}
	if a, b := strip(original.header), strip(replay.header); !maps.EqualFunc(a, b, slices.Equal) {
		t.Errorf("replay from %s has other header fields than the original (%s):\n%v\n%v", replay.from, original.from, a, b)
	}
}
