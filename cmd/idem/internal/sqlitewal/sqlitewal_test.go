package sqlitewal

import (
	"context"
	"database/sql"
	"encoding/binary"
	"path/filepath"
	"testing"

	_ "modernc.org/sqlite"
)

// Each write transaction on a real database ends in one commit frame and
// writes at least one page; a read writes nothing.
func TestReadCountsFramesAndCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "wal.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(wal)&_pragma=wal_autocheckpoint(0)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if c, err := Read(path); err != nil || c != (Counts{}) {
		t.Fatalf("before the first write: %+v, %v; want none", c, err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`); err != nil {
		t.Fatal(err)
	}
	before, err := Read(path)
	if err != nil || before.Commits != 1 || before.Frames < 1 {
		t.Fatalf("after CREATE TABLE: %+v, %v; want 1 commit", before, err)
	}
	const n = 5
	for i := range n {
		if _, err := db.ExecContext(ctx, `INSERT INTO t VALUES (?, 'x')`, i); err != nil {
			t.Fatal(err)
		}
	}
	// One transaction of two pages' worth of rows: a multi-frame commit.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO t VALUES (?, zeroblob(500))`, 100+i); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	after, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := after.Commits - before.Commits; got != n+1 {
		t.Errorf("%d commits, want %d", got, n+1)
	}
	if got := after.Frames - before.Frames; got < n+2 {
		t.Errorf("%d frames, want at least %d (one per small insert, several for the large one)", got, n+2)
	}
	pages, err := ReadPages(path)
	if err != nil || len(pages) != after.Frames {
		t.Fatalf("ReadPages: %d pages, %v; want one per frame (%d)", len(pages), err, after.Frames)
	}
	var size uint32
	if err := db.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&size); err != nil {
		t.Fatal(err)
	}
	for _, p := range pages[before.Frames:] {
		if p < 1 || p > size {
			t.Errorf("page %d written, outside the database's %d pages", p, size)
		}
	}
	var v string
	if err := db.QueryRowContext(ctx, `SELECT v FROM t WHERE id = 0`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if again, err := Read(path); err != nil || again != after {
		t.Errorf("a read changed the log: %+v, want %+v (%v)", again, after, err)
	}
}

// Frames after one with other salts are left over from before the log
// restarted, and a header too short or with a nonsense page size counts
// nothing.
func TestParse(t *testing.T) {
	t.Parallel()
	const page = 512
	hdr := func(salt1 uint32) []byte {
		h := make([]byte, headerLen)
		be32(h[8:], page)
		be32(h[16:], salt1)
		be32(h[20:], 7)
		return h
	}
	frame := func(commit, salt1 uint32) []byte {
		f := make([]byte, frameHeaderLen+page)
		be32(f[4:], commit)
		be32(f[8:], salt1)
		be32(f[12:], 7)
		return f
	}
	wal := hdr(1)
	for _, f := range [][]byte{frame(0, 1), frame(3, 1), frame(4, 1), frame(5, 2), frame(6, 1)} {
		wal = append(wal, f...)
	}
	if got, want := Parse(wal), (Counts{Frames: 3, Commits: 2}); got != want {
		t.Errorf("Parse = %+v, want %+v", got, want)
	}
	if got := Parse(wal[:len(hdr(1))+frameHeaderLen+page-1]); got != (Counts{}) {
		t.Errorf("a truncated frame counted: %+v", got)
	}
	if got := Parse(wal[:headerLen-1]); got != (Counts{}) {
		t.Errorf("a short header counted: %+v", got)
	}
	bad := append([]byte(nil), wal...)
	be32(bad[8:], 0)
	if got := Parse(bad); got != (Counts{}) {
		t.Errorf("page size 0 counted: %+v", got)
	}
}

func be32(b []byte, v uint32) { binary.BigEndian.PutUint32(b, v) }

// Parse reads any bytes without panicking, and never counts more commits
// than frames or more frames than the input holds.
func FuzzParse(f *testing.F) {
	h := make([]byte, headerLen+frameHeaderLen+512)
	be32(h[8:], 512)
	be32(h[headerLen+4:], 1)
	f.Add(h)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, wal []byte) {
		c := Parse(wal)
		if c.Commits > c.Frames || c.Frames < 0 {
			t.Fatalf("Parse = %+v", c)
		}
		if c.Frames > 0 && headerLen+c.Frames*(frameHeaderLen+512) > len(wal) {
			t.Fatalf("Parse = %+v from %d bytes", c, len(wal))
		}
	})
}
