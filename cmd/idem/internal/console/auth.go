package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
	"unicode"
)

// MinTokenLength is the shortest token LoadToken accepts.
const MinTokenLength = 16

// maxTokenLength bounds a token file's contents.
const maxTokenLength = 4096

// LoadToken reads the console token from the file at path: its contents
// without surrounding white space, at least MinTokenLength printable
// characters. warning is not empty when the file can be read or written by
// other users than its owner (whoever reads it can use the console).
func LoadToken(path string) (token, warning string, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", "", err
	}
	if !fi.Mode().IsRegular() {
		return "", "", fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() > maxTokenLength {
		return "", "", fmt.Errorf("%s holds %d bytes; a token is at most %d", path, fi.Size(), maxTokenLength)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	token = strings.TrimSpace(string(b))
	switch {
	case len(token) < MinTokenLength:
		return "", "", fmt.Errorf("%s: the token must be at least %d characters (generate one: openssl rand -hex 32 > %s)", path, MinTokenLength, path)
	case strings.ContainsFunc(token, func(r rune) bool { return !unicode.IsPrint(r) || r == ' ' }):
		return "", "", fmt.Errorf("%s: the token must be one line of printable characters without spaces", path)
	}
	if mode := fi.Mode().Perm(); mode&0o077 != 0 {
		warning = fmt.Sprintf("the console token file %s is open to other users (mode %04o): anyone who can read it can use the console; fix: chmod 600 %s",
			path, uint32(mode&fs.ModePerm), path)
	}
	return token, warning, nil
}

// CheckAddr refuses an address to listen on that is not a loopback one
// when no token protects the console: a console without a token must not
// be reachable from other machines.
func CheckAddr(addr string, hasToken bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if hasToken || isLoopbackHost(host) {
		return nil
	}
	return fmt.Errorf("%s is not a loopback address: a console reachable from other machines needs --console-token-file "+
		"(a file holding a token of at least %d characters, sent as a bearer token or typed into the login form)", addr, MinTokenLength)
}

// CheckListener is CheckAddr for the address a listener got (a host name
// such as "localhost" resolved to it).
func CheckListener(ln net.Listener, hasToken bool) error {
	if hasToken {
		return nil
	}
	if a, ok := ln.Addr().(*net.TCPAddr); ok && a.IP.IsLoopback() {
		return nil
	}
	return fmt.Errorf("the console listens on %s, which is not a loopback address; give --console-token-file", ln.Addr())
}

// isLoopbackHost reports whether host is "localhost" or a loopback IP.
func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Names of the cookies and form fields the console uses.
const (
	sessionCookie = "idem_console"
	csrfField     = "csrf"
	// sessionTTL is how long a login lasts.
	sessionTTL = 12 * time.Hour
	// confirmTTL is how long a confirmation page's form can be sent.
	confirmTTL = 10 * time.Minute
)

// session is who a request comes from.
type session struct {
	// id identifies the session ("bearer" for requests with the token in
	// their Authorization field).
	id string
	// bearer is set for token-authenticated requests without a cookie.
	bearer bool
}

// who names the session in the audit log, never with a secret.
func (s session) who(r *http.Request, hasToken bool) string {
	switch {
	case s.bearer:
		return "bearer token from " + r.RemoteAddr
	case hasToken:
		return "session " + s.id[:8] + " (logged in with the token) from " + r.RemoteAddr
	}
	return "session " + s.id[:8] + " (loopback, no token) from " + r.RemoteAddr
}

// mac is HMAC-SHA256 under the console's key of the length-prefixed parts.
func (c *Console) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, c.key)
	for _, p := range parts {
		var n [binary.MaxVarintLen64]byte
		m.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

// newSessionCookie issues a session.
func (c *Console) newSessionCookie(now time.Time) (*http.Cookie, session) {
	id := randomID()
	issued := now.Unix()
	v := id + "." + fmt.Sprint(issued)
	sig := base64.RawURLEncoding.EncodeToString(c.mac("session", v))
	return &http.Cookie{Name: sessionCookie, Value: v + "." + sig, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: false, MaxAge: int(sessionTTL / time.Second)}, session{id: id}
}

// sessionOf returns the session of a request's cookie, if it is valid.
func (c *Console) sessionOf(r *http.Request, now time.Time) (session, bool) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, false
	}
	parts := strings.Split(ck.Value, ".")
	if len(parts) != 3 || len(parts[0]) != 32 {
		return session{}, false
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, c.mac("session", parts[0]+"."+parts[1])) {
		return session{}, false
	}
	var issued int64
	if _, err := fmt.Sscan(parts[1], &issued); err != nil || now.Sub(time.Unix(issued, 0)) > sessionTTL {
		return session{}, false
	}
	return session{id: parts[0]}, true
}

// bearerOK reports whether r carries the token as a bearer token, and
// whether it carries any bearer token at all.
func (c *Console) bearerOK(r *http.Request) (ok, present bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return false, false
	}
	return c.tokenMatches(strings.TrimSpace(tok)), true
}

// tokenMatches compares a presented token with the console's in constant
// time (of the presented length's hash: no length leaks either).
func (c *Console) tokenMatches(presented string) bool {
	a := sha256.Sum256([]byte(presented))
	b := sha256.Sum256([]byte(c.token))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1 && c.token != ""
}

// csrfToken is the form token of a session.
func (c *Console) csrfToken(s session) string {
	return base64.RawURLEncoding.EncodeToString(c.mac("csrf", s.id))
}

// checkCSRF checks a POST: the session's form token, and for browser
// sessions that the request comes from the console's own pages.
func (c *Console) checkCSRF(r *http.Request, s session) error {
	got := r.PostFormValue(csrfField)
	if subtle.ConstantTimeCompare([]byte(got), []byte(c.csrfToken(s))) != 1 {
		return errors.New("the form's CSRF token is missing or wrong: reload the page and try again")
	}
	if s.bearer {
		return nil // a bearer token is never sent by a browser on its own
	}
	return sameOrigin(r)
}

// sameOrigin checks Sec-Fetch-Site and Origin: a browser's POST from
// another site is refused. A browser sends at least one of them.
func sameOrigin(r *http.Request) error {
	site, origin := r.Header.Get("Sec-Fetch-Site"), r.Header.Get("Origin")
	if site == "" && origin == "" {
		return errors.New("the request names neither its origin nor its site (Origin, Sec-Fetch-Site): refused")
	}
	if site != "" && site != "same-origin" {
		return fmt.Errorf("the request comes from another site (Sec-Fetch-Site: %s): refused", site)
	}
	if origin != "" {
		scheme := "http://"
		if r.TLS != nil {
			scheme = "https://"
		}
		if origin != scheme+r.Host {
			return errors.New("the request comes from another origin: refused")
		}
	}
	return nil
}

// confirmToken binds a confirmation form to its session, action, record
// (or message) and fence, for confirmTTL from issued.
func (c *Console) confirmToken(s session, action, target string, fence int64, issued time.Time) string {
	ts := fmt.Sprint(issued.Unix())
	return ts + "." + base64.RawURLEncoding.EncodeToString(c.mac("confirm", s.id, action, target, fmt.Sprint(fence), ts))
}

// checkConfirm checks a confirmation token sent with an action.
func (c *Console) checkConfirm(tok string, s session, action, target string, fence int64, now time.Time) error {
	ts, _, ok := strings.Cut(tok, ".")
	var issued int64
	if !ok || len(ts) > 20 {
		return errors.New("the action was not confirmed: open its confirmation page first")
	}
	if _, err := fmt.Sscan(ts, &issued); err != nil {
		return errors.New("the action was not confirmed: open its confirmation page first")
	}
	if now.Sub(time.Unix(issued, 0)) > confirmTTL {
		return errors.New("the confirmation expired: open the confirmation page again")
	}
	want := c.confirmToken(s, action, target, fence, time.Unix(issued, 0))
	if subtle.ConstantTimeCompare([]byte(tok), []byte(want)) != 1 {
		return errors.New("the action was not confirmed: open its confirmation page first")
	}
	return nil
}

// loopbackHost reports whether a request's Host names a loopback address:
// a console without a token answers only those, so that a web page whose
// host name an attacker points at 127.0.0.1 (DNS rebinding) cannot read it.
func loopbackHost(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		host = r.Host
	}
	return isLoopbackHost(strings.Trim(host, "[]"))
}
