// Package idemcrypt encrypts what idem stores: every stored response and
// every recovery point, sealed with AES-256-GCM under a data key of its
// own, wrapped by a [KeyProvider] and bound to its record. A handler author
// builds one [Encryption] and sets it on the configuration:
//
//	keyring, err := idemcrypt.LoadKeyring("keys") // lines of id:base64-32-bytes
//	if err != nil { ... }
//	enc, err := idemcrypt.New(keyring, nil)
//	if err != nil { ... }
//	mw, err := idem.NewMiddleware(store, &idem.Config{Encryption: enc})
//
// The core seals and opens; every store gets encryption without knowing
// of it. A record that cannot be opened answers [ErrRecordUnreadable]
// (idem.ErrRecordUnreadable, 503 idempotency.record_unreadable): never a
// replay of bytes that did not authenticate, and never a second execution.
// [Keyring] is the static provider (rotation: append a key, restart, remove
// the old one after a TTL); a KMS client can implement [KeyProvider].
// [Config.AcceptPlaintext] reads records stored in clear while encryption is
// being turned on, and [Config.HashKey] keeps tenants and keys out of the
// store. docs/security.md lists what stays in clear.
package idemcrypt
