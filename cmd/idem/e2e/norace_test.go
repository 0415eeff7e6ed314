//go:build !race

package e2e

// raceEnabled is set when the tests are built with -race; the idem binary
// is then built with -race too.
const raceEnabled = false
