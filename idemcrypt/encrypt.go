package idemcrypt

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/idemhq/idem/idemstore"
	"hash"
	"net/http"
	"sync"
)

// ErrRecordUnreadable is returned by idem.Executor.Do (and answered with 503
// idempotency.record_unreadable) when a record exists but what it holds
// cannot be decrypted: the stored response of a completed record, or the
// recovery point (see Step) of one in flight. Its key id is no longer in
// the keyring, the ciphertext was altered or copied from another record,
// or the record is encrypted and no keys are configured (or not encrypted
// and plaintext is not accepted). The key keeps its record: the operation
// is never executed again (nor resumed) and nothing undecryptable is
// replayed. It is not a store failure, so Config.FailOpen does not apply
// to it.
var ErrRecordUnreadable = errors.New("idem: the stored record cannot be decrypted")

// Encryption protects what idem stores (set it as Config.Encryption):
//
//   - every stored response (status, header fields, body) is sealed with
//     AES-256-GCM under a random data key of its own, and that data key is
//     wrapped by the KeyProvider, whose key id is stored with the record;
//   - every recovery point of a multi-step operation (see Step) is sealed
//     the same way each time it is saved (see SealCheckpoint);
//   - the record's scope and key are authenticated as associated data of
//     both (and, for a recovery point, its fingerprint), so a ciphertext
//     moved to another record does not decrypt;
//   - optionally (Config.HashKey) the stores hold an HMAC of the
//     scope and the key instead of the client's values.
//
// It works in the core, on the Response handed to Store.Complete (and
// idemstore.Tx.Complete) and returned by Store.Claim, and on the checkpoints
// handed to StepStore.SaveCheckpoint (and CheckpointTx) and returned by
// Store.Claim and StepStore.Stuck, so every store gets it and keeps its
// optional capabilities. What stays in clear is listed in docs/security.md.
// An Encryption is immutable and safe for concurrent use. Its methods
// accept a nil receiver, which means encryption off.
type Encryption struct {
	keys            KeyProvider
	hashKey         []byte
	acceptPlaintext bool
	// macs holds HMAC-SHA256 states under hashKey: building one costs
	// more than the digest of a scope and a key.
	macs sync.Pool
}

// Config configures New. A nil *Config
// means every default.
type Config struct {
	// HashKey, when set, makes the core hand stores an HMAC-SHA256 of the
	// record scope and of the idempotency key (base64url, 43 characters
	// each) instead of the values themselves, so a store's contents name no
	// tenant and no client key. It must be at least 32 bytes, secret, and
	// the same for as long as records live: with another HashKey every
	// stored record is out of reach, and a retry of an operation already
	// executed would run it again. It therefore never rotates with the
	// keyring, and is turned on only with a store that holds no records
	// (a new table, schema or key prefix): records written without it are
	// out of reach the same way. Defaults to none: scope and key are
	// stored as they are.
	HashKey []byte

	// AcceptPlaintext accepts records that are not encrypted: those
	// written before encryption was turned on, within their TTL. A
	// completed one replays its response; one in flight resumes from its
	// recovery point, and the checkpoints it saves from then on are
	// sealed. Everything written with the Encryption is sealed either way.
	// Without it such a record is answered with ErrRecordUnreadable (503
	// idempotency.record_unreadable), since with encryption on no record
	// in clear should exist.
	//
	// A record is in clear or sealed by its form alone (a response without
	// the envelope field, a checkpoint that starts with '{'): a sealed one
	// that does not open is unreadable, with or without AcceptPlaintext,
	// and is never read as plaintext. The trade-off: while it is set,
	// someone who can write to the store can plant a record in clear (or
	// replace a sealed one with one in clear) that will be replayed or
	// resumed, so turn it off once a TTL has passed since encryption was
	// turned on; no record in clear is left by then. It cannot be combined
	// with HashKey: records written before HashKey are stored under the
	// clear scope and key, which lookups under the digests never find (a
	// retry would run again instead of replaying). Defaults to false.
	AcceptPlaintext bool
}

// New returns an Encryption that wraps data keys with keys.
func New(keys KeyProvider, cfg *Config) (*Encryption, error) {
	if keys == nil {
		return nil, errors.New("idem: encryption: nil KeyProvider")
	}
	e := &Encryption{keys: keys}
	if cfg != nil {
		if cfg.HashKey != nil && len(cfg.HashKey) < 32 {
			return nil, fmt.Errorf("idem: encryption: HashKey is %d bytes, want at least 32", len(cfg.HashKey))
		}
		e.hashKey = append([]byte(nil), cfg.HashKey...)
		if len(e.hashKey) == 0 {
			e.hashKey = nil
		}
		e.acceptPlaintext = cfg.AcceptPlaintext
		if e.acceptPlaintext && e.hashKey != nil {
			return nil, errors.New("idem: encryption: AcceptPlaintext cannot be combined with HashKey: records stored in clear are named by the clear scope and key, which lookups under HashKey's digests never find, so their retries would run again; turn HashKey on only with an empty store")
		}
	}
	e.macs.New = func() any { return hmac.New(sha256.New, e.hashKey) }
	return e, nil
}

// envelopeField marks a sealed response. A name that starts with a colon
// is no valid HTTP/1 field name and is a pseudo-header in HTTP/2, so no
// handler's response carries it: a sealed record is never mistaken for a
// plain one, with or without encryption configured.
const envelopeField = ":idem-envelope"

const (
	// envelopeV1 is the first value of the envelope field: the format.
	envelopeV1 = "v1"
	// sealedStatus is the status code of a sealed response as stores see
	// it; the real one is inside the ciphertext.
	sealedStatus = http.StatusOK
	dataKeySize  = 32
	gcmNonceSize = 12
	gcmTagSize   = 16
)

// Seal returns the form of r to store for (scope, key). r's status, header
// fields and flags (its binary encoding without the body) followed by its
// body are encrypted as one AES-256-GCM message under a fresh data key, and
// the ciphertext is split: the body's part becomes the sealed response's
// body, of the same length as r's, so that encryption never pushes a body
// over a store's limit; the rest travels in the field ":idem-envelope",
// whose values are "v1" and the base64url of: key id and wrapped data key
// (each a uvarint length and bytes), the 12-byte nonce, the 16-byte tag,
// and the encrypted status and header fields. The sealed response's status
// is 200. scope and key are the record's own (not hashed); with a nil
// receiver Seal returns r.
func (e *Encryption) Seal(ctx context.Context, scope, key string, r *idemstore.Response) (*idemstore.Response, error) {
	if e == nil {
		return r, nil
	}
	meta, err := (&idemstore.Response{StatusCode: r.StatusCode, Header: r.Header, Unreplayable: r.Unreplayable}).MarshalBinary()
	if err != nil {
		return nil, err
	}
	var rnd [dataKeySize + gcmNonceSize]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("idem: encryption: %w", err)
	}
	dk, nonce := rnd[:dataKeySize], rnd[dataKeySize:]
	aad := envelopeAAD(scope, key, len(meta))
	keyID, wrapped, err := e.keys.WrapKey(ctx, dk, aad)
	if err != nil {
		return nil, fmt.Errorf("idem: encryption: wrap data key: %w", err)
	}
	aead, err := newGCM(dk)
	if err != nil {
		return nil, err
	}
	plain := make([]byte, 0, len(meta)+len(r.Body)+gcmTagSize)
	plain = append(append(plain, meta...), r.Body...)
	ct := aead.Seal(plain[:0], nonce, plain, aad)
	metaCt, bodyCt, tag := ct[:len(meta)], ct[len(meta):len(ct)-gcmTagSize], ct[len(ct)-gcmTagSize:]

	env := make([]byte, 0, 2*binary.MaxVarintLen64+len(keyID)+len(wrapped)+gcmNonceSize+gcmTagSize+len(metaCt))
	env = appendField(env, keyID)
	env = appendField(env, wrapped)
	env = append(append(append(env, nonce...), tag...), metaCt...)
	var body []byte
	if len(bodyCt) > 0 {
		body = bodyCt
	}
	return &idemstore.Response{StatusCode: sealedStatus, Body: body, Header: http.Header{
		envelopeField: {envelopeV1, base64.RawURLEncoding.EncodeToString(env)},
	}}, nil
}

// Open returns the response that Seal sealed into r for (scope, key). It
// returns an error wrapping ErrRecordUnreadable (and ErrUnknownKeyID or
// ErrDecrypt where they apply) when it cannot: it never returns bytes that
// did not authenticate. A response that is not sealed is returned as it is
// if encryption is off (nil receiver) or AcceptPlaintext is set.
func (e *Encryption) Open(ctx context.Context, scope, key string, r *idemstore.Response) (*idemstore.Response, error) {
	if r == nil {
		return nil, nil
	}
	v, sealed := r.Header[envelopeField]
	if !sealed {
		if e == nil || e.acceptPlaintext {
			return r, nil
		}
		return nil, fmt.Errorf("%w: the response is stored in clear and AcceptPlaintext is off (Config.AcceptPlaintext; idem serve|proxy --accept-plaintext)", ErrRecordUnreadable)
	}
	if e == nil {
		return nil, fmt.Errorf("%w: the record is encrypted and no encryption keys are configured", ErrRecordUnreadable)
	}
	if len(v) != 2 || v[0] != envelopeV1 || len(r.Header) != 1 || r.StatusCode != sealedStatus || r.Unreplayable {
		return nil, fmt.Errorf("%w: unknown envelope format", ErrRecordUnreadable)
	}
	env, err := base64.RawURLEncoding.Strict().DecodeString(v[1])
	if err != nil {
		return nil, fmt.Errorf("%w: malformed envelope", ErrRecordUnreadable)
	}
	d := decoder{b: env}
	keyID := d.field()
	wrapped := d.field()
	if d.err != nil || len(d.b) < gcmNonceSize+gcmTagSize {
		return nil, fmt.Errorf("%w: malformed envelope", ErrRecordUnreadable)
	}
	nonce, tag, metaCt := d.b[:gcmNonceSize], d.b[gcmNonceSize:gcmNonceSize+gcmTagSize], d.b[gcmNonceSize+gcmTagSize:]
	aad := envelopeAAD(scope, key, len(metaCt))
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
	ct := make([]byte, 0, len(metaCt)+len(r.Body)+gcmTagSize)
	ct = append(append(append(ct, metaCt...), r.Body...), tag...)
	plain, err := aead.Open(ct[:0], nonce, ct, aad)
	if err != nil {
		return nil, fmt.Errorf("%w: %w: response under key %q", ErrRecordUnreadable, ErrDecrypt, keyID)
	}
	out := new(idemstore.Response)
	if err := out.UnmarshalBinary(plain[:len(metaCt)]); err != nil || len(out.Body) != 0 {
		return nil, fmt.Errorf("%w: malformed sealed response", ErrRecordUnreadable)
	}
	if len(plain) > len(metaCt) {
		out.Body = plain[len(metaCt):]
	}
	return out, nil
}

// HashesKeys reports whether stores see digests of scopes and keys
// (Config.HashKey) rather than the values; false for a nil receiver.
func (e *Encryption) HashesKeys() bool { return e != nil && e.hashKey != nil }

// StoredKey returns the (scope, key) under which stores keep the record
// of (scope, key): HMAC-SHA256 digests under Config.HashKey, or
// the values themselves without one (or with a nil receiver). The key's
// digest covers the scope too, so equal keys of two tenants do not show as
// equal digests.
func (e *Encryption) StoredKey(scope, key string) (string, string) {
	if e == nil || e.hashKey == nil {
		return scope, key
	}
	m := e.macs.Get().(hash.Hash)
	defer e.macs.Put(m)
	var in [256]byte
	var sum [sha256.Size]byte
	m.Reset()
	m.Write(append(append(in[:0], 's'), scope...))
	hs := base64.RawURLEncoding.EncodeToString(m.Sum(sum[:0]))
	m.Reset()
	b := binary.AppendUvarint(append(in[:0], 'k'), uint64(len(scope)))
	m.Write(append(append(b, scope...), key...))
	return hs, base64.RawURLEncoding.EncodeToString(m.Sum(sum[:0]))
}

// envelopeAAD is the associated data that binds a sealed response (and its
// wrapped data key) to its record.
func envelopeAAD(scope, key string, metaLen int) []byte {
	b := make([]byte, 0, 32+len(scope)+len(key))
	b = append(b, "idem-envelope-v1"...)
	b = appendField(b, scope)
	b = appendField(b, key)
	return binary.AppendUvarint(b, uint64(metaLen))
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// appendField appends a length-prefixed field, as the envelope and the
// associated data write them.
func appendField[T string | []byte](buf []byte, v T) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(v)))
	return append(buf, v...)
}

// decoder reads the fields appendField wrote; the first malformed one sets
// err, and every later read returns nothing.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) field() []byte {
	if d.err != nil {
		return nil
	}
	n, k := binary.Uvarint(d.b)
	if k <= 0 || n > uint64(len(d.b)-k) {
		d.err = errMalformed
		return nil
	}
	f := d.b[k : k+int(n) : k+int(n)]
	d.b = d.b[k+int(n):]
	return f
}

var errMalformed = errors.New("idemcrypt: malformed field")
