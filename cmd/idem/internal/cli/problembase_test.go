package cli

import (
	"net/http"
	"strings"
	"testing"
)

func TestServeProblemBaseURL(t *testing.T) {
	t.Parallel()
	url := startServe(t, "--problem-base-url", "https://docs.example.com/idem#")
	req, _ := http.NewRequest(http.MethodPost, url+"/api/payments", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := `<https://docs.example.com/idem#idempotency.key_missing>; rel="describedby"`
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Link") != want {
		t.Errorf("%d, Link %q, want %q", resp.StatusCode, resp.Header.Get("Link"), want)
	}
}
