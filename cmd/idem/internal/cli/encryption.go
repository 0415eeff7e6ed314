package cli

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/idemhq/idem"
)

// encryptionFlag registers --encryption-keys, shared by idem serve and idem
// proxy.
func (f *flags) encryptionFlag() *string {
	return f.String("encryption-keys", "", "file of id:base64-32-bytes lines, newest last: encrypt every stored\nresponse (AES-256-GCM, a data key per record wrapped by the newest\nkey; older keys still decrypt). See docs/security.md")
}

// loadEncryption reads the keyring file named by --encryption-keys and
// returns the encryption (nil for an empty path: off) and an attribute
// for the start-up log line. The error names the file and the line, never
// key material.
func loadEncryption(path string) (*idem.Encryption, slog.Attr, error) {
	if path == "" {
		return nil, slog.String("encryption", "off"), nil
	}
	kr, err := idem.LoadKeyring(path)
	if err != nil {
		return nil, slog.Attr{}, err
	}
	enc, err := idem.NewEncryption(kr, nil)
	if err != nil {
		return nil, slog.Attr{}, err
	}
	return enc, slog.String("encryption", fmt.Sprintf("AES-256-GCM, keys %s, new records under %s",
		strings.Join(kr.IDs(), ","), kr.CurrentID())), nil
}
