package backend

import "testing"

func TestKindOf(t *testing.T) {
	for spec, want := range map[string]Kind{
		"idem.db": SQLite, "/var/lib/idem/x.db": SQLite, "memory": Memory,
		"postgres://u@h/db": Postgres, "postgresql://h/db": Postgres,
		"redis://127.0.0.1:6379/0": Redis, "rediss://h:6380": Redis,
	} {
		if got := KindOf(spec); got != want {
			t.Errorf("KindOf(%q) = %s, want %s", spec, got, want)
		}
	}
}

func TestCutQuery(t *testing.T) {
	rest, v, err := cutQuery("redis://127.0.0.1:6379/2?prefix=t1:&protocol=3", "prefix")
	if err != nil || v != "t1:" || rest != "redis://127.0.0.1:6379/2?protocol=3" {
		t.Fatalf("cutQuery = %q %q %v", rest, v, err)
	}
	rest, v, _ = cutQuery("postgres://h/db", "idem_schema")
	if rest != "postgres://h/db" || v != "" {
		t.Fatalf("absent parameter: %q %q", rest, v)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://user:secret@host/db": "postgres://user:xxxxx@host/db",
		"redis://:pw@127.0.0.1:6379/0":   "redis://:xxxxx@127.0.0.1:6379/0",
		"postgres://user@host/db":        "postgres://user@host/db",
		"idem.db":                        "idem.db",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
