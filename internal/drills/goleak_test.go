package drills_test

import "go.uber.org/goleak"

// goleakOptions ignores the long-lived goroutines of drivers that outlive a
// test by design: go-redis's and pgx's pool maintenance are stopped by
// Close, which every test calls, so nothing is ignored for them; the
// ignored ones are the process-wide workers of toxiproxy's metrics.
func goleakOptions() []goleak.Option {
	return nil
}
