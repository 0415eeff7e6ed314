package idemclient

// RetryAfter exposes retryAfter to the external tests.
var RetryAfter = retryAfter
