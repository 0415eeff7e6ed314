package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// child is a server process the harness started: a serve-system or
// plain-payments process of the harness's own binary, or an idem binary.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string // host:port of the system
	ctl   string // host:port of the control server; "" if none
	done  chan struct{}
	// stderr keeps the end of the process's error output, for reports.
	stderr *tailBuffer
}

// startChild starts exe with args and waits for its ready line on stdout.
func startChild(ctx context.Context, name, exe string, args ...string) (*child, error) {
	cmd := exec.CommandContext(ctx, exe, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &child{name: name, cmd: cmd, stdin: stdin, done: make(chan struct{}), stderr: &tailBuffer{max: 4096}}
	cmd.Stderr = c.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	br := bufio.NewReader(stdout)
	rd, err := readReadyTimeout(br, c.done, 2*time.Minute)
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("%s: %w (stderr: %s)", name, err, c.stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, br) }()
	c.addr, c.ctl = rd.Addr, rd.Ctl
	return c, nil
}

// readReadyTimeout reads the ready line, giving up when the process exits
// or the timeout passes.
func readReadyTimeout(br *bufio.Reader, done <-chan struct{}, timeout time.Duration) (ready, error) {
	type res struct {
		rd  ready
		err error
	}
	ch := make(chan res, 1)
	go func() {
		rd, err := readReady(br)
		ch <- res{rd, err}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.rd, r.err
	case <-done:
		return ready{}, errors.New("the process exited before it was ready")
	case <-t.C:
		return ready{}, errors.New("no ready line in time")
	}
}

// stop ends the process: closing its standard input asks it to exit; it
// is killed if it has not within 10 seconds.
func (c *child) stop() {
	if c == nil {
		return
	}
	_ = c.stdin.Close()
	if c.cmd.Process != nil {
		_ = c.cmd.Process.Signal(os.Interrupt)
	}
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) url(path string) string { return "http://" + c.addr + path }

var ctlClient = &http.Client{Timeout: 30 * time.Second}

// control calls the child's control server and decodes its stats.
func (c *child) control(method, path string) (stats, error) {
	var st stats
	err := c.controlJSON(context.Background(), ctlClient, method, path, &st)
	return st, err
}

// controlJSON calls the child's control server and decodes its JSON
// answer, if any, into v.
func (c *child) controlJSON(ctx context.Context, client *http.Client, method, path string, v any) error {
	if c.ctl == "" {
		return errors.New("no control server")
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+c.ctl+path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: status %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(body))
	}
	if len(bytes.TrimSpace(body)) > 0 {
		return json.Unmarshal(body, v)
	}
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.b))
}

// rssKiB returns a process's resident set size (VmRSS) and its peak
// (VmHWM), in KiB, from /proc.
func rssKiB(pid int) (rss, hwm uint64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch name {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	return rss, hwm
}

// rssSampler records the peak resident set size of a process while it
// runs, sampling every 50 ms.
type rssSampler struct {
	stop chan struct{}
	done chan uint64
}

func sampleRSS(pid int) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan uint64, 1)}
	go func() {
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		var peak uint64
		for {
			if r, _ := rssKiB(pid); r > peak {
				peak = r
			}
			select {
			case <-s.stop:
				s.done <- peak
				return
			case <-tk.C:
			}
		}
	}()
	return s
}

// finish stops sampling and returns the peak in KiB.
func (s *rssSampler) finish() uint64 {
	close(s.stop)
	return <-s.done
}
