package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/proxy"
	"github.com/idemhq/idem/idemcrypt"
)

// encryptionFlag registers --encryption-keys, shared by idem serve, idem
// proxy and idem inspect.
func (f *flags) encryptionFlag() *string {
	return f.String("encryption-keys", "", "file of id:base64-32-bytes lines, newest last: encrypt every stored\nresponse and recovery point (AES-256-GCM, a data key per record wrapped\nby the newest key; older keys still decrypt). See docs/security.md")
}

// encryptionFlags are the encryption flags of idem serve and idem proxy.
type encryptionFlags struct {
	keys            *string
	acceptPlaintext *bool
}

func (f *flags) encryptionFlags() encryptionFlags {
	return encryptionFlags{
		keys:            f.encryptionFlag(),
		acceptPlaintext: f.Bool("accept-plaintext", false, "with --encryption-keys, also replay (and resume) the records stored\nin clear before encryption was turned on, instead of answering 503\nidempotency.record_unreadable; new records are encrypted either way.\nRemove it once --ttl has passed since encryption was turned on"),
	}
}

// load reads the keyring file and returns the encryption (nil without
// --encryption-keys: off) and an attribute for the start-up log line. It
// warns through logger when the keyring file is open to other users, and
// when records in clear are accepted, with ttl (the longest a record lives)
// after which the flag can go. The error names the flag, the file and the
// line, never key material; exitCodeOf gives its exit status.
func (ef encryptionFlags) load(logger *slog.Logger, ttl time.Duration) (*idemcrypt.Encryption, slog.Attr, error) {
	if *ef.keys == "" {
		if *ef.acceptPlaintext {
			return nil, slog.Attr{}, usageError{errors.New("--accept-plaintext needs --encryption-keys: without keys every record is stored in clear and read as it is")}
		}
		return nil, slog.String("encryption", "off"), nil
	}
	enc, attr, err := loadEncryption(*ef.keys, &idemcrypt.Config{AcceptPlaintext: *ef.acceptPlaintext}, func(msg string) {
		logger.Warn(msg, "file", *ef.keys)
	})
	if err != nil {
		return nil, slog.Attr{}, fmt.Errorf("--encryption-keys: %w", err)
	}
	if *ef.acceptPlaintext {
		attr.Value = slog.StringValue(attr.Value.String() + "; records stored in clear are accepted (--accept-plaintext)")
		logger.Warn("--accept-plaintext: records stored in clear before encryption was turned on are replayed and resumed; "+
			"while it is set, someone who can write to the store can plant such a record. Remove it once --ttl has passed since encryption was turned on",
			"ttl", ttl, "remove_after", time.Now().Add(ttl).UTC().Format(time.RFC3339))
	}
	return enc, attr, nil
}

// usageError is an error in the flags, answered with exit status 2.
type usageError struct{ error }

// exitCodeOf returns the exit status for an error of load.
func exitCodeOf(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return exitUsage
	}
	return exitError
}

// longestTTL returns the longest of base and the TTL of every route in
// file (nil: none): how long a record written now may live.
func longestTTL(base time.Duration, file *proxy.File) time.Duration {
	if file != nil {
		for _, r := range file.ProxyRoutes() {
			base = max(base, r.Settings.TTL)
		}
	}
	return base
}

// loadEncryption reads the keyring file at path and returns the encryption
// with cfg (nil for an empty path: off) and an attribute for the start-up
// log line. It calls warn when the file can be read or written by other
// users than its owner. The error names the file and the line, never key
// material.
func loadEncryption(path string, cfg *idemcrypt.Config, warn func(msg string)) (*idemcrypt.Encryption, slog.Attr, error) {
	if path == "" {
		return nil, slog.String("encryption", "off"), nil
	}
	kr, err := idemcrypt.LoadKeyring(path)
	if err != nil {
		return nil, slog.Attr{}, err
	}
	if msg := keyringPermissions(path); msg != "" && warn != nil {
		warn(msg)
	}
	enc, err := idemcrypt.New(kr, cfg)
	if err != nil {
		return nil, slog.Attr{}, err
	}
	return enc, slog.String("encryption", fmt.Sprintf("AES-256-GCM, keys %s, new records under %s",
		strings.Join(kr.IDs(), ","), kr.CurrentID())), nil
}

// keyringPermissions returns a warning when the keyring file at path (the
// file a symbolic link points to) can be read or written by users other
// than its owner, with the command that fixes it, or "" when it cannot.
// Whoever reads the file reads every stored record; whoever writes it can
// make new records readable to themselves.
func keyringPermissions(path string) string {
	fi, err := os.Stat(path)
	if err != nil {
		return "" // LoadKeyring just read it; a race with a rename is not worth a warning
	}
	mode := fi.Mode().Perm()
	if mode&0o077 == 0 {
		return ""
	}
	who := "other users"
	if mode&0o007 == 0 {
		who = "its group"
	}
	return fmt.Sprintf("the keyring file %s is open to %s (mode %04o): anyone who can read it can decrypt every stored record; "+
		"fix: chmod 600 %s, with the file owned by the user idem runs as", path, who, uint32(mode&fs.ModePerm), shellQuote(path))
}

// shellQuote quotes s for a POSIX shell if it holds anything but safe
// characters.
func shellQuote(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+=:,@", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
