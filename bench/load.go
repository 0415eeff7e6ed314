package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// request is one request a load worker sends.
type request struct {
	method string
	url    string
	body   []byte
	key    string // the Idempotency-Key field value; empty: none
}

// reqFunc returns the request worker w sends as its i-th request.
type reqFunc func(w, i int) request

// loadSpec is one closed-loop measurement: workers send requests back to
// back, each waiting for its answer, until Duration has passed or
// MaxRequests have been sent, whichever comes first.
type loadSpec struct {
	Workers     int
	Duration    time.Duration
	MaxRequests int64
	// Warmup is the number of untimed requests each worker sends first,
	// which opens its keep-alive connection and, for the replay path,
	// creates the record it then replays.
	Warmup int
	Req    reqFunc
	// Status is the status code every measured answer must have.
	Status int
	// Started, if set, is called after the warm-up, as the clock starts.
	Started func()
	// Stop, if set, ends the measurement early when closed; requests in
	// flight finish and count, and every worker sends at least one
	// request, so that a measurement is never empty.
	Stop <-chan struct{}
}

// loadResult is what a measurement saw.
type loadResult struct {
	Requests int64
	Errors   int64
	// FirstError describes the first unexpected answer or transport error.
	FirstError string
	Elapsed    time.Duration
	// Latencies holds every measured request's latency, sorted.
	Latencies []time.Duration
}

// Throughput is requests per second.
func (r loadResult) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Percentile returns the p-quantile (0 < p <= 1) of the latencies, by the
// nearest-rank method.
func (r loadResult) Percentile(p float64) time.Duration {
	return percentile(r.Latencies, p)
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(len(sorted)-1, rank))]
}

// newClient returns an HTTP client tuned for closed-loop load over
// loopback: enough idle keep-alive connections for every worker, no
// compression, no HTTP/2, no proxy.
func newClient(maxConns int) *http.Client {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4 * maxConns,
		MaxIdleConnsPerHost: 2 * maxConns,
		IdleConnTimeout:     5 * time.Minute,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		WriteBufferSize:     16 << 10,
		ReadBufferSize:      16 << 10,
	}
	return &http.Client{Transport: tr, Timeout: 60 * time.Second}
}

// doRequest sends one request and drains the answer, returning its status.
func doRequest(ctx context.Context, c *http.Client, rq request, rd *bytes.Reader) (int, error) {
	var body io.Reader = http.NoBody
	if rd == nil {
		rd = new(bytes.Reader)
	}
	if rq.body != nil {
		rd.Reset(rq.body)
		body = rd
	}
	req, err := http.NewRequestWithContext(ctx, rq.method, rq.url, body)
	if err != nil {
		return 0, err
	}
	if rq.body != nil {
		req.ContentLength = int64(len(rq.body))
		req.Header["Content-Type"] = []string{"application/json"}
	}
	if rq.key != "" {
		req.Header["Idempotency-Key"] = []string{rq.key}
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// runLoad runs one measurement with client c. It stops by itself: at the
// deadline, after MaxRequests, or when ctx ends.
func runLoad(ctx context.Context, c *http.Client, spec loadSpec) loadResult {
	if spec.MaxRequests <= 0 {
		spec.MaxRequests = 1 << 62
	}
	var (
		mu       sync.Mutex
		firstErr string
		errs     atomic.Int64
		sent     atomic.Int64
	)
	fail := func(msg string) {
		errs.Add(1)
		mu.Lock()
		if firstErr == "" {
			firstErr = msg
		}
		mu.Unlock()
	}
	// Warm-up: every worker opens its connection and sends its untimed
	// requests, all at once, before the clock starts.
	var wg sync.WaitGroup
	for w := range spec.Workers {
		wg.Go(func() {
			var rd bytes.Reader
			for i := range spec.Warmup {
				rq := spec.Req(w, -1-i)
				if _, err := doRequest(ctx, c, rq, &rd); err != nil {
					fail("warm-up: " + err.Error())
					return
				}
			}
		})
	}
	wg.Wait()
	if errs.Load() > 0 {
		return loadResult{Errors: errs.Load(), FirstError: firstErr}
	}

	lat := make([][]time.Duration, spec.Workers)
	if spec.Started != nil {
		spec.Started()
	}
	start := time.Now()
	deadline := start.Add(spec.Duration)
	for w := range spec.Workers {
		wg.Go(func() {
			var rd bytes.Reader
			l := make([]time.Duration, 0, 1024)
			for i := 0; ; i++ {
				if sent.Add(1) > spec.MaxRequests {
					break
				}
				t0 := time.Now()
				if !t0.Before(deadline) || ctx.Err() != nil || (i > 0 && stopped(spec.Stop)) {
					break
				}
				rq := spec.Req(w, i)
				status, err := doRequest(ctx, c, rq, &rd)
				d := time.Since(t0)
				switch {
				case err != nil:
					fail(err.Error())
				case status != spec.Status:
					fail(fmt.Sprintf("%s %s: status %d, want %d", rq.method, rq.url, status, spec.Status))
				}
				l = append(l, d)
			}
			lat[w] = l
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	return loadResult{Requests: int64(len(all)), Errors: errs.Load(), FirstError: firstErr, Elapsed: elapsed, Latencies: all}
}

func stopped(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
