package idemcrypt

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
)

// KeyProvider wraps and unwraps the data keys of encrypted records (see
// Encryption). Each record is encrypted with its own random data key;
// the provider encrypts that data key with a key-encryption key (KEK) and
// names the KEK with a key id that is stored with the record. The static
// Keyring implements it; a cloud KMS client can implement it too, the aad
// mapping to its encryption context.
//
// Implementations must be safe for concurrent use. Every call is bounded by
// the context the core passes (Config.StoreTimeout for completions).
type KeyProvider interface {
	// WrapKey encrypts dataKey under the provider's current (newest) key,
	// binding aad to it, and returns that key's id with the wrapped key.
	WrapKey(ctx context.Context, dataKey, aad []byte) (keyID string, wrapped []byte, err error)

	// UnwrapKey decrypts a data key wrapped by WrapKey under keyID with the
	// same aad. It returns an error wrapping ErrUnknownKeyID if the provider
	// no longer has keyID (a retired key), and an error wrapping
	// ErrDecrypt if wrapped does not authenticate under keyID and aad.
	UnwrapKey(ctx context.Context, keyID string, wrapped, aad []byte) ([]byte, error)
}

var (
	// ErrUnknownKeyID is returned by KeyProvider.UnwrapKey for a key id the
	// provider does not hold: the key that encrypted the record was removed
	// from the keyring.
	ErrUnknownKeyID = errors.New("idem: unknown encryption key id")

	// ErrDecrypt is returned when a stored ciphertext does not
	// authenticate: it was altered, or moved to another (scope, key).
	ErrDecrypt = errors.New("idem: stored ciphertext does not authenticate")
)

// Key is one key-encryption key of a Keyring.
type Key struct {
	// ID names the key in every record it protects: 1 to 64 characters from
	// A-Z a-z 0-9 . _ -. Ids are not secret.
	ID string
	// Key is the AES-256 key: exactly 32 bytes.
	Key []byte
}

// Keyring is a static KeyProvider: a list of AES-256-GCM key-encryption
// keys, newest last. New records are wrapped under the newest key; records
// under any key still in the list stay readable. Rotation is therefore:
// append a new key (every instance, then restart them), let the records
// under the old key expire (Config.TTL), then remove the old key.
//
// A Keyring is immutable and safe for concurrent use.
type Keyring struct {
	ids   []string
	aeads map[string]cipher.AEAD
}

var _ KeyProvider = (*Keyring)(nil)

// maxKeyringFile bounds the keyring file LoadKeyring reads: a keyring of a
// thousand keys is far smaller.
const maxKeyringFile = 1 << 20

// NewKeyring returns a keyring of keys, newest last. It fails on an empty
// list, an invalid or duplicate id, or a key that is not 32 bytes.
func NewKeyring(keys ...Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("idem: keyring: no keys")
	}
	k := &Keyring{aeads: make(map[string]cipher.AEAD, len(keys))}
	for _, kk := range keys {
		if !validKeyID(kk.ID) {
			return nil, fmt.Errorf("idem: keyring: invalid key id %q: want 1 to 64 characters from A-Z a-z 0-9 . _ -", kk.ID)
		}
		if _, dup := k.aeads[kk.ID]; dup {
			return nil, fmt.Errorf("idem: keyring: duplicate key id %q", kk.ID)
		}
		if len(kk.Key) != 32 {
			return nil, fmt.Errorf("idem: keyring: key %q is %d bytes, want 32 (AES-256)", kk.ID, len(kk.Key))
		}
		block, err := aes.NewCipher(kk.Key)
		if err != nil {
			return nil, fmt.Errorf("idem: keyring: key %q: %w", kk.ID, err)
		}
		// A GCM instance holds no per-call state, so one per key serves
		// every goroutine.
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("idem: keyring: key %q: %w", kk.ID, err)
		}
		k.ids = append(k.ids, kk.ID)
		k.aeads[kk.ID] = aead
	}
	return k, nil
}

// ParseKeyring parses a keyring in text form: one key per line as
// "id:base64", the key being 32 bytes in standard base64 (with padding),
// newest last. Blank lines and lines starting with # are ignored; spaces
// around a line are trimmed. Generate a key with
// `head -c 32 /dev/urandom | base64`. Errors name the line but never
// contain key material.
func ParseKeyring(data []byte) (*Keyring, error) {
	if len(data) > maxKeyringFile {
		return nil, fmt.Errorf("idem: keyring: %d bytes, limit %d", len(data), maxKeyringFile)
	}
	var keys []Key
	for i, line := range bytes.Split(data, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		id, b64, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return nil, fmt.Errorf("idem: keyring: line %d: want id:base64-32-bytes", i+1)
		}
		if !validKeyID(string(id)) {
			return nil, fmt.Errorf("idem: keyring: line %d: invalid key id: want 1 to 64 characters from A-Z a-z 0-9 . _ -", i+1)
		}
		key := make([]byte, base64.StdEncoding.DecodedLen(len(b64)))
		n, err := base64.StdEncoding.Strict().Decode(key, b64)
		if err != nil {
			return nil, fmt.Errorf("idem: keyring: line %d (key %q): the key is not valid base64", i+1, id)
		}
		if n != 32 {
			return nil, fmt.Errorf("idem: keyring: line %d (key %q): the key is %d bytes, want 32 (AES-256)", i+1, id, n)
		}
		keys = append(keys, Key{ID: string(id), Key: key[:n]})
	}
	if len(keys) == 0 {
		return nil, errors.New("idem: keyring: no keys (want one id:base64-32-bytes line per key, newest last)")
	}
	return NewKeyring(keys...)
}

// LoadKeyring reads and parses the keyring file at path (see
// ParseKeyring).
func LoadKeyring(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("idem: keyring: %w", err)
	}
	defer func() { _ = f.Close() }()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyringFile+1))
	if err != nil {
		return nil, fmt.Errorf("idem: keyring: %s: %w", path, err)
	}
	k, err := ParseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return k, nil
}

// IDs returns the key ids, newest last.
func (k *Keyring) IDs() []string { return slices.Clone(k.ids) }

// CurrentID returns the id of the key that wraps new records: the newest.
func (k *Keyring) CurrentID() string { return k.ids[len(k.ids)-1] }

// WrapKey implements KeyProvider: AES-256-GCM under the newest key, with a
// random nonce prepended.
func (k *Keyring) WrapKey(_ context.Context, dataKey, aad []byte) (string, []byte, error) {
	id := k.CurrentID()
	aead := k.aeads[id]
	out := make([]byte, aead.NonceSize(), aead.NonceSize()+len(dataKey)+aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return "", nil, err
	}
	return id, aead.Seal(out, out, dataKey, aad), nil
}

// UnwrapKey implements KeyProvider.
func (k *Keyring) UnwrapKey(_ context.Context, keyID string, wrapped, aad []byte) ([]byte, error) {
	aead, ok := k.aeads[keyID]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownKeyID, keyID)
	}
	ns := aead.NonceSize()
	if len(wrapped) < ns+aead.Overhead() {
		return nil, fmt.Errorf("%w: wrapped key too short", ErrDecrypt)
	}
	dk, err := aead.Open(nil, wrapped[:ns], wrapped[ns:], aad)
	if err != nil {
		return nil, fmt.Errorf("%w: data key under key %q", ErrDecrypt, keyID)
	}
	return dk, nil
}

func validKeyID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
