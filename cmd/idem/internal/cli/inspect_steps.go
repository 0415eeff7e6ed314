package cli

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
)

// openCheckpoints opens the recovery points of the records in flight with
// enc (nil when no --encryption-keys was given), in place, and notes in
// notes[i] what to say about a sealed one, as openResponses does for
// responses: a checkpoint it cannot open is dropped from its record, so
// that ciphertext is never printed as steps.
func openCheckpoints(ctx context.Context, enc *idemcrypt.Encryption, recs []idemstore.RecordInfo, notes []string) {
	for i := range recs {
		r := &recs[i]
		if len(r.Checkpoint) == 0 {
			continue
		}
		var none *idemcrypt.Encryption // opens exactly the checkpoints stored in clear
		if _, err := none.OpenCheckpoint(ctx, r.Scope, r.Key, r.Fingerprint, r.Checkpoint); err == nil {
			continue
		}
		if enc == nil {
			notes[i], r.Checkpoint = "recovery point encrypted; give --encryption-keys to read its steps", nil
			continue
		}
		cp, err := enc.OpenCheckpoint(ctx, r.Scope, r.Key, r.Fingerprint, r.Checkpoint)
		if err != nil {
			notes[i], r.Checkpoint = "recovery point encrypted and unreadable with these keys: "+err.Error(), nil
			continue
		}
		notes[i], r.Checkpoint = "recovery point encrypted; decrypted with --encryption-keys", cp
	}
}

// printSteps prints the steps of r's (opened) recovery point: one summary
// line, and with showBody each step's data.
func printSteps(line func(k, format string, args ...any), r idemstore.RecordInfo) {
	if len(r.Checkpoint) == 0 {
		return
	}
	steps, err := idem.ParseCheckpoint(r.Checkpoint)
	if err != nil {
		line("steps", "unreadable: %v", err)
		return
	}
	parts := make([]string, len(steps))
	for i, st := range steps {
		parts[i] = termField(st.Name) + " (" + stepState(st) + ")"
	}
	line("steps", "%s", strings.Join(parts, ", "))
}

// printStepData prints the data of each completed step (--show-body):
// recovery points hold what later steps need, such as amounts and
// references.
func printStepData(w io.Writer, r idemstore.RecordInfo) {
	steps, err := idem.ParseCheckpoint(r.Checkpoint)
	if err != nil || len(steps) == 0 {
		return
	}
	fmt.Fprintln(w)
	for _, st := range steps {
		if st.Done {
			fmt.Fprintf(w, "step %s: %s\n", termField(st.Name), printableOrQuoted(st.Data))
		}
	}
}

func stepState(st idem.StepState) string {
	switch {
	case st.Done:
		return "done"
	case st.Unknown:
		return "outcome unknown"
	}
	return "not done"
}

// printableOrQuoted returns b escaped for the terminal as termText does
// (one line) if it is UTF-8 text, and Go-quoted otherwise, so that no
// stored byte reaches the terminal as a control sequence.
func printableOrQuoted(b []byte) string {
	if utf8.Valid(b) {
		t, _ := termText(string(b), false)
		return t
	}
	return strconv.Quote(string(b))
}

// stepJSON is a step in --json.
type stepJSON struct {
	Name  string `json:"name"`
	State string `json:"state"` // done, unknown, not-done
	// Data is the step's data (--show-body, done steps): as text when it
	// is UTF-8, else in DataBase64.
	Data       *string `json:"data,omitempty"`
	DataBase64 string  `json:"dataBase64,omitempty"`
}

// stepsJSON returns r's steps for --json (nil without a readable
// recovery point).
func stepsJSON(r idemstore.RecordInfo, showBody bool) []stepJSON {
	steps, err := idem.ParseCheckpoint(r.Checkpoint)
	if err != nil || len(steps) == 0 {
		return nil
	}
	out := make([]stepJSON, len(steps))
	for i, st := range steps {
		out[i] = stepJSON{Name: st.Name, State: strings.ReplaceAll(strings.TrimPrefix(stepState(st), "outcome "), " ", "-")}
		if showBody && st.Done {
			if utf8.Valid(st.Data) {
				d := string(st.Data)
				out[i].Data = &d
			} else {
				out[i].DataBase64 = base64.StdEncoding.EncodeToString(st.Data)
			}
		}
	}
	return out
}
