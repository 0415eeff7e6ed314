package idem

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
)

// derivedKeyPrefix starts every derived key, so that a derived key is never
// mistaken for a client's.
const derivedKeyPrefix = "idem-"

// ErrNoExecution is returned by DeriveKey outside an idempotent execution.
var ErrNoExecution = errors.New("idem: the context is not an idempotent execution")

// DeriveKey returns the idempotency key for the step called step of the
// execution ctx belongs to: the key to send to a downstream system (a card
// provider's Idempotency-Key) for that step. It is deterministic (the same
// scope, key and step give the same value in every process and after every
// restart, so a resumed or reconciled operation sends the same key again),
// collision-resistant, and reveals nothing of the client's key (see
// Config.DeriveKeySecret). Record it next to your own data to keep the
// correlation between both keys.
func DeriveKey(ctx context.Context, step string) (string, error) {
	info, ok := InfoFromContext(ctx)
	r := stepRunFrom(ctx)
	if !ok || r == nil {
		return "", ErrNoExecution
	}
	return DeriveKeyWith(r.x.e.cfg.DeriveKeySecret, info.Scope, info.Key, step), nil
}

// DeriveKeyWith is DeriveKey for an explicit secret, scope and key, for
// code outside an execution (a reconciler that looks a charge up, a test).
// The value is "idem-" and 43 characters of unpadded base64url: 256 bits
// of HMAC-SHA256(secret, scope, key, step), each input length-prefixed so
// that no two triples share an input; with no secret, SHA-256 of the same
// input under a domain separator. It is a valid Idempotency-Key.
func DeriveKeyWith(secret []byte, scope, key, step string) string {
	var in []byte
	in = append(in, "idem derived key v1\x00"...)
	for _, s := range []string{scope, key, step} {
		in = binary.AppendUvarint(in, uint64(len(s)))
		in = append(in, s...)
	}
	var sum []byte
	if len(secret) > 0 {
		m := hmac.New(sha256.New, secret)
		m.Write(in)
		sum = m.Sum(nil)
	} else {
		s := sha256.Sum256(in)
		sum = s[:]
	}
	return derivedKeyPrefix + base64.RawURLEncoding.EncodeToString(sum)
}
