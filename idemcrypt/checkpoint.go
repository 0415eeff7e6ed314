package idemcrypt

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"github.com/idemhq/idem/idemstore"
)

// Recovery points (see Step) are sealed as responses are: each saved
// checkpoint is one AES-256-GCM message under a fresh data key, wrapped by
// the KeyProvider and bound to its record. The stored form is
//
//	"\x00idemcp1" | uvarint len, key id | uvarint len, wrapped key | nonce (12) | ciphertext and tag
//
// A checkpoint in clear is a JSON object, so its first byte is '{'. That
// byte is the whole distinction: stored bytes that start with '{' are in
// clear, and any others are taken for sealed and must open. Damaging a
// seal therefore never turns it into plaintext; only replacing it with a
// whole plain checkpoint does, and that is refused unless
// Config.AcceptPlaintext is set.
const checkpointMagic = "\x00idemcp1"

// maxSealedCheckpoint bounds the stored form OpenCheckpoint reads: the
// largest checkpoint in clear plus room for a KMS's key id and wrapped key.
const maxSealedCheckpoint = idemstore.MaxCheckpoint + 8<<10

// SealCheckpoint returns the form of checkpoint to store for the record
// (scope, key, fingerprint): sealed with AES-256-GCM under a fresh data key
// that the KeyProvider wraps, with the record's scope, key and fingerprint
// (the client's values, not hashed) as associated data. A sealed
// checkpoint is as long as the plain one plus the envelope (about 60 bytes
// and the wrapped key). With a nil receiver it returns checkpoint as it is.
func (e *Encryption) SealCheckpoint(ctx context.Context, scope, key, fingerprint string, checkpoint []byte) ([]byte, error) {
	if e == nil {
		return checkpoint, nil
	}
	var rnd [dataKeySize + gcmNonceSize]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("idem: encryption: %w", err)
	}
	dk, nonce := rnd[:dataKeySize], rnd[dataKeySize:]
	aad := checkpointAAD(scope, key, fingerprint)
	keyID, wrapped, err := e.keys.WrapKey(ctx, dk, aad)
	if err != nil {
		return nil, fmt.Errorf("idem: encryption: wrap data key: %w", err)
	}
	aead, err := newGCM(dk)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(checkpointMagic)+2*binary.MaxVarintLen64+len(keyID)+len(wrapped)+gcmNonceSize+len(checkpoint)+gcmTagSize)
	out = append(out, checkpointMagic...)
	out = appendField(out, keyID)
	out = appendField(out, wrapped)
	out = append(out, nonce...)
	return aead.Seal(out, nonce, checkpoint, aad), nil
}

// OpenCheckpoint returns the checkpoint that SealCheckpoint sealed into
// stored for the record (scope, key, fingerprint), ready for
// ParseCheckpoint. It returns an error wrapping ErrRecordUnreadable (and
// ErrUnknownKeyID or ErrDecrypt where they apply) when it cannot: a seal
// that does not open, under a key id the KeyProvider no longer has, or
// moved from another record; a sealed checkpoint with encryption off (nil
// receiver); or a checkpoint in clear with encryption on, unless
// Config.AcceptPlaintext is set. It never returns bytes that did
// not authenticate, except a checkpoint in clear where clear is accepted.
// An empty stored checkpoint opens to nil.
func (e *Encryption) OpenCheckpoint(ctx context.Context, scope, key, fingerprint string, stored []byte) ([]byte, error) {
	if len(stored) == 0 {
		return nil, nil
	}
	if stored[0] == '{' {
		if e == nil || e.acceptPlaintext {
			return stored, nil
		}
		return nil, fmt.Errorf("%w: the recovery point is stored in clear and AcceptPlaintext is off (Config.AcceptPlaintext; idem serve --accept-plaintext)", ErrRecordUnreadable)
	}
	if e == nil {
		return nil, fmt.Errorf("%w: the recovery point is encrypted and no encryption keys are configured", ErrRecordUnreadable)
	}
	if len(stored) > maxSealedCheckpoint || len(stored) < len(checkpointMagic) || string(stored[:len(checkpointMagic)]) != checkpointMagic {
		return nil, fmt.Errorf("%w: unknown recovery point format", ErrRecordUnreadable)
	}
	d := decoder{b: stored[len(checkpointMagic):]}
	keyID := d.field()
	wrapped := d.field()
	if d.err != nil || len(d.b) < gcmNonceSize+gcmTagSize {
		return nil, fmt.Errorf("%w: malformed recovery point", ErrRecordUnreadable)
	}
	nonce, ct := d.b[:gcmNonceSize], d.b[gcmNonceSize:]
	aad := checkpointAAD(scope, key, fingerprint)
	dk, err := e.keys.UnwrapKey(ctx, string(keyID), wrapped, aad)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRecordUnreadable, err)
	}
	if len(dk) != dataKeySize {
		return nil, fmt.Errorf("%w: data key of %d bytes", ErrRecordUnreadable, len(dk))
	}
	aead, err := newGCM(dk)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRecordUnreadable, err)
	}
	plain, err := aead.Open(nil, nonce, ct, aad)
	if err != nil {
		return nil, fmt.Errorf("%w: %w: recovery point under key %q", ErrRecordUnreadable, ErrDecrypt, keyID)
	}
	return plain, nil
}

// checkpointAAD is the associated data that binds a sealed checkpoint (and
// its wrapped data key) to its record. Its prefix differs from a
// response's, so that neither seal opens as the other. The fingerprint is
// bound too: a recovery point holds what the request asked for (an amount,
// a reference), and must not be resumed under another request's
// fingerprint written over the record's.
func checkpointAAD(scope, key, fingerprint string) []byte {
	b := make([]byte, 0, 32+len(scope)+len(key)+len(fingerprint))
	b = append(b, "idem-checkpoint-v1"...)
	b = appendField(b, scope)
	b = appendField(b, key)
	return appendField(b, fingerprint)
}
