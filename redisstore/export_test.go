package redisstore

// The scripts, for the benchmarks' raw-client baseline: the same EVALSHA
// calls the store makes, without the store around them.
var (
	ClaimScript    = claimScript
	CompleteScript = completeScript
)
