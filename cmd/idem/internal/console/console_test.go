package console

import (
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every page, on every store: the security headers, no caching of pages
// that show records, and no key in any link.
func TestPagesOnEveryStore(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.open(t)
			sd := seed(t, s, 7)
			b := setup(t, s, nil)
			check := func(path string, want int) string {
				t.Helper()
				code, body, h := b.get(path)
				if code != want {
					t.Fatalf("GET %s = %d, want %d:\n%s", path, code, want, body)
				}
				for k, v := range map[string]string{"X-Frame-Options": "DENY", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"} {
					if h.Get(k) != v {
						t.Errorf("GET %s: %s = %q, want %q", path, k, h.Get(k), v)
					}
				}
				if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "frame-ancestors 'none'") || strings.Contains(csp, "unsafe") {
					t.Errorf("GET %s: Content-Security-Policy %q", path, csp)
				}
				for _, key := range append(slices.Clone(sd.completed), sd.live, sd.gone) {
					if strings.Contains(body, `href="`) && strings.Contains(hrefs(body), key) {
						t.Errorf("GET %s: a link holds the key %q", path, key)
					}
				}
				return body
			}
			over := check("/", http.StatusOK)
			if !strings.Contains(over, `id="count-inflight">3<`) && sd.susp != "" || sd.susp == "" && !strings.Contains(over, `id="count-inflight">2<`) {
				t.Errorf("the overview does not count the records in flight:\n%s", over)
			}
			list := check("/records", http.StatusOK)
			ids := idRE.FindAllStringSubmatch(list, -1)
			if len(ids) != 7+2+boolInt(sd.susp != "") {
				t.Fatalf("the records page lists %d records, want %d:\n%s", len(ids), 7+2+boolInt(sd.susp != ""), list)
			}
			check("/records?state=in-flight", http.StatusOK)
			check("/records?state=completed&limit=3", http.StatusOK)
			rec := check("/records/"+ids[0][1], http.StatusOK)
			if !strings.Contains(rec, "Fingerprint") {
				t.Errorf("the record page shows no fingerprint:\n%s", rec)
			}
			check("/records/"+strings.Repeat("0", 64), http.StatusNotFound)
		})
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// hrefs returns the link targets of a page.
func hrefs(body string) string {
	var out []string
	for _, part := range strings.Split(body, `href="`)[1:] {
		out = append(out, part[:strings.IndexByte(part, '"')])
	}
	return strings.Join(out, "\n")
}

// Paging walks every record once, in every listing, on every store; the
// filters select what they name.
func TestPagingAndFilters(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.open(t)
			sd := seed(t, s, 11)
			b := setup(t, s, nil)
			walk := func(query string) []string {
				t.Helper()
				var keys []string
				path := "/records?limit=2"
				if query != "" {
					path += "&" + query
				}
				for range 50 {
					code, body, _ := b.get(path)
					if code != http.StatusOK {
						t.Fatalf("GET %s = %d:\n%s", path, code, body)
					}
					for _, m := range keyRE.FindAllStringSubmatch(body, -1) {
						keys = append(keys, m[1])
					}
					next := nextRE.FindStringSubmatch(body)
					if next == nil {
						return keys
					}
					path = html.UnescapeString(next[1])
					if strings.Contains(path, "done-") || strings.Contains(path, "key") {
						t.Fatalf("a page link holds a key: %s", path)
					}
				}
				t.Fatal("more than 50 pages")
				return nil
			}
			all := walk("")
			want := append(slices.Clone(sd.completed), sd.live, sd.gone)
			if sd.susp != "" {
				want = append(want, sd.susp)
			}
			if s.Kind == "redis" {
				// Redis keeps keys hashed: the pages show ids.
				if n := len(idRE.FindAllString(strings.Join(all, "\n"), -1)); n != 0 {
					t.Fatalf("keys in clear on Redis: %v", all)
				}
				return
			}
			slices.Sort(all)
			slices.Sort(want)
			if !slices.Equal(all, want) {
				t.Fatalf("paging listed\n%v\nwant\n%v", all, want)
			}
			// In flight: by lease end, the live lease last.
			inflight := walk("state=in-flight")
			wantIn := []string{sd.gone, sd.live}
			if sd.susp != "" {
				wantIn = append(wantIn, sd.susp)
			}
			// (A store listed through its own cursor keeps its order.)
			sorted := b.console.info.Sorted
			if !slices.Equal(sortedIf(inflight, true), sortedIf(wantIn, true)) || sorted && len(inflight) > 0 && inflight[len(inflight)-1] != sd.live {
				t.Errorf("in flight: %v, want %v with %s last", inflight, wantIn, sd.live)
			}
			if sd.susp != "" {
				if got := walk("state=suspended"); !slices.Equal(got, []string{sd.susp}) {
					t.Errorf("suspended: %v, want %v", got, []string{sd.susp})
				}
			}
			if got := walk("state=completed"); len(got) != len(sd.completed) {
				t.Errorf("completed: %d records, want %d", len(got), len(sd.completed))
			}
			scoped := walk("scope=" + url.QueryEscape(sd.otherScope))
			if len(scoped) != len(sd.completed)/3 {
				t.Errorf("scope %s: %v, want %d records", sd.otherScope, scoped, len(sd.completed)/3)
			}
			// The records were claimed a moment ago: none is older than
			// a minute, all are older than nothing.
			if got := walk("older=1m"); len(got) != 0 {
				t.Errorf("older than a minute: %v, want none", got)
			}
			if got := walk("state=expired"); len(got) != 0 {
				t.Errorf("expired: %v, want none", got)
			}
		})
	}
}

func sortedIf(s []string, yes bool) []string {
	s = slices.Clone(s)
	if yes {
		slices.Sort(s)
	}
	return s
}

var (
	keyRE  = regexp.MustCompile(`<td><code>([a-z]+-[^<]*)</code></td>\s*<td>`)
	nextRE = regexp.MustCompile(`id="next" href="([^"]+)"`)
)

// The stores listed through their own cursor (memory, Redis) page by it,
// not by an offset: a record deleted from a page already shown moves no
// other record across the page boundary, each record is listed once, and
// walking again gives the same order.
func TestInspectorCursorPaging(t *testing.T) {
	t.Parallel()
	for _, be := range backends[2:] { // Redis, memory
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.open(t)
			seed(t, s, 9)
			b := setup(t, s, nil)
			if b.console.info.Sorted {
				t.Fatal("an inspector source claims SQL sorting")
			}
			// walk lists every page from the first, calling between after
			// the first page, and returns the ids in order.
			walk := func(between func(first []string)) []string {
				t.Helper()
				var ids []string
				path := "/records?limit=3"
				for page := 0; page < 50; page++ {
					code, body, _ := b.get(path)
					if code != http.StatusOK {
						t.Fatalf("GET %s = %d:\n%s", path, code, body)
					}
					var these []string
					seen := map[string]bool{}
					for _, m := range idRE.FindAllStringSubmatch(body, -1) {
						if !seen[m[1]] {
							seen[m[1]] = true
							these = append(these, m[1])
						}
					}
					ids = append(ids, these...)
					if page == 0 && between != nil {
						between(these)
					}
					next := nextRE.FindStringSubmatch(body)
					if next == nil {
						return ids
					}
					path = html.UnescapeString(next[1])
					if !strings.Contains(path, "after=t") {
						t.Fatalf("the next page's link is not a store cursor: %s", path)
					}
				}
				t.Fatal("more than 50 pages")
				return nil
			}
			first := walk(nil)
			if again := walk(nil); !slices.Equal(first, again) {
				t.Fatalf("two walks listed\n%v\n%v", first, again)
			}
			all := slices.Clone(first)
			slices.Sort(all)
			if len(slices.Compact(all)) != len(first) || len(first) < 11 {
				t.Fatalf("the walk listed %d records, %d distinct: %v", len(first), len(slices.Compact(all)), first)
			}
			var deleted string
			got := walk(func(page []string) {
				// Delete the first page's first record (a completed one
				// if possible) through the console's own action.
				for _, id := range page {
					if code, _ := b.act(id, "delete"); code == http.StatusOK {
						deleted = id
						return
					}
				}
				t.Fatalf("no completed record on the first page %v", page)
			})
			want := slices.DeleteFunc(slices.Clone(first), func(id string) bool { return id == deleted })
			got = slices.DeleteFunc(got, func(id string) bool { return id == deleted })
			if !slices.Equal(got, want) {
				t.Errorf("after deleting %s from the first page, the walk listed\n%v\nwant\n%v", deleted, got, want)
			}
		})
	}
}
