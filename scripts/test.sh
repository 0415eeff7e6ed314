#!/usr/bin/env bash
# test.sh runs all of idem's tests: formatting and vet, every package of
# every module in the workspace with the race detector (this includes the
# benchmark harness's smoke run, bench.TestSmoke, and the install of every
# module from a local module proxy, internal/releasetest), a short fuzzing pass over
# each parser, one iteration of every benchmark, the vulnerability audit
# (scripts/vulncheck.sh) and the end-to-end script against the real binary.
#
# Server-backed tests use PostgreSQL, Redis, NATS (JetStream) and RabbitMQ
# on this machine (IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL,
# IDEM_TEST_NATS_URL, IDEM_TEST_AMQP_URL); they skip when a server is
# unreachable, unless CI is set, in which case they fail.
#
# FUZZTIME (default 10s) sets each fuzz target's time; 0 skips fuzzing.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [[ -n "$unformatted" ]]; then
	echo "gofmt would change:"
	echo "$unformatted"
	exit 1
fi

step "go vet (every module)"
go vet github.com/idemhq/idem/...

step "go test -race (every module)"
go test -race -count=1 -timeout 15m github.com/idemhq/idem/...

fuzztime=${FUZZTIME:-10s}
# fuzz runs one target. Go's fuzzing coordinator sometimes ends a run with
# "context deadline exceeded" and no failing input when a worker answers
# late on a loaded machine (a known flake of the toolchain, not a finding):
# that one case is run again once. A real failure writes its input under
# testdata/fuzz and fails at once.
fuzz() {
	local out
	if out=$(go test -run '^$' -fuzz "^$2\$" -fuzztime "$fuzztime" "$1" </dev/null 2>&1); then
		echo "$out"
		return 0
	fi
	echo "$out"
	if grep -q 'context deadline exceeded' <<<"$out" && ! grep -q 'Failing input written' <<<"$out"; then
		echo "(the fuzzing coordinator timed out without a failing input; running $2 again)"
		go test -run '^$' -fuzz "^$2\$" -fuzztime "$fuzztime" "$1" </dev/null
		return
	fi
	return 1
}
if [[ "$fuzztime" != 0 ]]; then
	# Every parser: the key, canonical JSON, stored responses, the keyring
	# file and the encryption envelope, the proxy's configuration file,
	# Retry-After in the client, the payment request, the --store value, the
	# header search behind the proxy's Connection handling, the list
	# cursors, the operator commands' escaping and quoted arguments.
	while read -r pkg target; do
		step "fuzz $target ($fuzztime)"
		fuzz "$pkg" "$target"
	done <<-'EOF'
		github.com/idemhq/idem FuzzParseKey
		github.com/idemhq/idem FuzzCanonicalJSON
		github.com/idemhq/idem FuzzResponseDecoding
		github.com/idemhq/idem FuzzParseCheckpoint
		github.com/idemhq/idem FuzzParseKeyring
		github.com/idemhq/idem FuzzEnvelopeOpen
		github.com/idemhq/idem FuzzParseJSONPointer
		github.com/idemhq/idem FuzzFingerprintFields
		github.com/idemhq/idem/cmd/idem/internal/proxy FuzzParseFile
		github.com/idemhq/idem/idemclient FuzzRetryAfter
		github.com/idemhq/idem/cmd/idem/internal/payments FuzzValidate
		github.com/idemhq/idem/cmd/idem/internal/payments FuzzValidateMatchesOld
		github.com/idemhq/idem/cmd/idem/internal/payments FuzzValidateFieldsMatchOld
		github.com/idemhq/idem/cmd/idem/internal/payments FuzzAppendJSONString
		github.com/idemhq/idem/cmd/idem/internal/backend FuzzKindOf
		github.com/idemhq/idem/cmd/idem/internal/proxy FuzzDroppedConnection
		github.com/idemhq/idem/outbox FuzzHeaders
		github.com/idemhq/idem/cmd/idem/internal/events FuzzValidateSubject
		github.com/idemhq/idem FuzzParseListCursor
		github.com/idemhq/idem/redisstore FuzzParseCursor
		github.com/idemhq/idem/cmd/idem/internal/cli FuzzEscape
	EOF
fi

step "every benchmark once (-benchtime 1x), so that none rots"
go test -run '^$' -bench . -benchtime 1x -count=1 github.com/idemhq/idem/...

step "vulnerability audit: scripts/vulncheck.sh (govulncheck, offline database)"
./scripts/vulncheck.sh

step "end-to-end: scripts/verify.sh"
./scripts/verify.sh

step "all tests passed"
