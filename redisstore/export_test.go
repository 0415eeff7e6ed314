package redisstore

// CursorSkips returns how many records of a SCAN step the List cursor c
// passes over (listed on the page before), or an error for a cursor
// parseCursor refuses.
func CursorSkips(c string) (int, error) {
	cur, err := parseCursor(c)
	return len(cur.skip), err
}

// CanonicalCursor returns c as String writes what parseCursor reads from
// it.
func CanonicalCursor(c string) (string, error) {
	cur, err := parseCursor(c)
	if err != nil {
		return "", err
	}
	return cur.String(), nil
}

// DropListed is dropListed, for tests.
var DropListed = dropListed
