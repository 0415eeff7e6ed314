package releasetest

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/api.txt from the source")

// TestAPI compares the exported surface of every published package with
// testdata/api.txt, so that each change of the API shows in review as a
// change of that file. After an intended change:
//
//	go test ./internal/releasetest -run TestAPI -update
func TestAPI(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	got, err := API(root)
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "api.txt")
	if *update {
		if err := os.WriteFile(golden, []byte(strings.Join(got, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	b, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (create it with -update)", err)
	}
	want := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	var added, removed []string
	for _, l := range got {
		if _, found := slices.BinarySearch(want, l); !found {
			added = append(added, "+ "+l)
		}
	}
	for _, l := range want {
		if _, found := slices.BinarySearch(got, l); !found {
			removed = append(removed, "- "+l)
		}
	}
	if len(added)+len(removed) > 0 {
		t.Errorf("the exported API differs from %s (%d added, %d removed); if that is intended, run\n\tgo test ./internal/releasetest -run TestAPI -update\nand commit the file:\n%s",
			golden, len(added), len(removed), strings.Join(append(removed, added...), "\n"))
	}
}
