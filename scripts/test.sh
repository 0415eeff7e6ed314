#!/usr/bin/env bash
# test.sh runs all of idem's tests: formatting, vet and staticcheck, every package of
# every module in the workspace with the race detector (this includes the
# benchmark harness's smoke run, bench.TestSmoke, the install of every
# module from a local module proxy, internal/releasetest, and one iteration
# of every benchmark), a short fuzzing pass over each parser, the vulnerability audit
# (scripts/vulncheck.sh) and the end-to-end script against the real binary.
#
# Server-backed tests use PostgreSQL, Redis, NATS (JetStream) and RabbitMQ
# on this machine (IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL,
# IDEM_TEST_NATS_URL, IDEM_TEST_AMQP_URL); they skip when a server is
# unreachable, unless CI is set, in which case they fail.
#
# FUZZTIME (default 10s) sets each fuzz target's time; 0 skips fuzzing
# (FUZZTIME=0 ./scripts/test.sh is the quick run).
set -euo pipefail
cd "$(dirname "$0")/.."

# idem builds and tests with go1.27.3, which fixes standard-library
# vulnerabilities of go1.26 that an HTTP server and proxy reach. The go
# command downloads it through the module proxy on first use (go.work and
# cmd/idem/go.mod name it in their toolchain line; machines whose go.env
# says GOTOOLCHAIN=local need the variable).
export GOTOOLCHAIN=${GOTOOLCHAIN:-go1.27.3}
if [[ "$GOTOOLCHAIN" == local ]]; then export GOTOOLCHAIN=go1.27.3; fi
go version

# stages counts the stages below, so that each can say "[n/N]".
stages=7
stage=0
stage_name=
stage_start=$SECONDS
run_start=$SECONDS
# step starts the next stage and says how long the previous one took.
step() {
	if ((stage > 0)); then printf '    (stage %d took %d s)\n' "$stage" $((SECONDS - stage_start)); fi
	stage=$((stage + 1))
	stage_start=$SECONDS
	stage_name=$*
	printf '\n==> [%d/%d] %s\n' "$stage" "$stages" "$*"
}
# A failing stage is named at the end of the output, where a reader looks.
# It also removes the fuzzing binaries (below) when a target fails.
fuzzbin=
trap 'rc=$?; [[ -z "$fuzzbin" ]] || rm -rf "$fuzzbin"; if ((rc != 0)); then printf "\nFAILED in stage %d/%d (%s) after %d s in all\n" "$stage" "$stages" "$stage_name" $((SECONDS - run_start)); fi' EXIT

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [[ -n "$unformatted" ]]; then
	echo "gofmt would change:"
	echo "$unformatted"
	exit 1
fi

step "go vet (every module)"
go vet github.com/idemhq/idem/...

step "staticcheck (every module)"
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 github.com/idemhq/idem/...

# Every benchmark runs once (-benchtime 1x), so that none rots, in the same
# race-detecting test binaries as the tests: a separate run without -race
# compiled and linked every test binary a second time (minutes on a cold
# build cache) for a few seconds of benchmarks.
step "go test -race, and every benchmark once (every module)"
go test -race -count=1 -bench . -benchtime 1x -timeout 15m github.com/idemhq/idem/...

fuzztime=${FUZZTIME:-10s}
# Each package with fuzz targets gets its fuzzing test binary built once
# (go test -c -fuzz); the binary lists the package's targets (-test.list,
# so a new target runs without anyone adding it to a list) and fuzzes each
# from the package's directory, where its corpus (testdata/fuzz) lives.
# Linking a large package's test binary for every target took longer than
# the fuzzing. The go command's own fuzz cache directory is kept.
fuzzbin=$(mktemp -d)
fuzzcache=$(go env GOCACHE)/fuzz
# fuzz DIR PKG BIN TARGET runs one target. Go's fuzzing coordinator
# sometimes ends a run with "context deadline exceeded" and no failing
# input when a worker answers late on a loaded machine (a known flake of
# the toolchain, not a finding): that one case is run again once. A real
# failure writes its input under testdata/fuzz and fails at once.
fuzz() {
	local out
	if out=$(fuzz_once "$@"); then
		echo "$out"
		return 0
	fi
	echo "$out"
	if grep -q 'context deadline exceeded' <<<"$out" && ! grep -q 'Failing input written' <<<"$out"; then
		echo "(the fuzzing coordinator timed out without a failing input; running $4 again)"
		fuzz_once "$@"
		return
	fi
	return 1
}
fuzz_once() {
	(cd "$1" && "$3" -test.run '^$' -test.fuzz "^$4\$" -test.fuzztime "$fuzztime" -test.fuzzcachedir "$fuzzcache/$2" </dev/null 2>&1)
}
step "fuzz every parser (${fuzztime} per target; FUZZTIME=0 skips)"
if [[ "$fuzztime" != 0 ]]; then
	dirs=$(git grep -l '^func Fuzz' -- '*_test.go' | xargs -r -n1 dirname | sort -u)
	[[ -n "$dirs" ]] || { echo "no fuzz targets found"; exit 1; }
	# FUZZBUDGET=N (seconds) stops starting packages once the stage has run
	# N seconds; the packages left then ran only their seed corpora (the go
	# test stage above runs every Fuzz function on its seeds). The order
	# rotates by the day of the year, so that successive days' runs start
	# with different packages and every package gets fuzzed.
	if [[ -n "${FUZZBUDGET:-}" ]]; then
		n=$(wc -w <<<"$dirs")
		shift_by=$((10#$(date -u +%j) % n))
		dirs=$( (tail -n +$((shift_by + 1)) <<<"$dirs"; head -n "$shift_by" <<<"$dirs") )
	fi
	fuzz_start=$SECONDS
	for dir in $dirs; do
		if [[ -n "${FUZZBUDGET:-}" ]] && ((SECONDS - fuzz_start >= FUZZBUDGET)); then
			echo "--- budget of ${FUZZBUDGET}s spent: $dir not fuzzed in this run (its seeds ran in the go test stage)"
			continue
		fi
		pkg=$(cd "$dir" && go list .)
		bin="$fuzzbin/${pkg//\//_}.test"
		(cd "$dir" && go test -c -fuzz . -o "$bin" .)
		targets=$("$bin" -test.list '^Fuzz')
		[[ -n "$targets" ]] || { echo "$pkg declares a Fuzz function but lists no target"; exit 1; }
		for target in $targets; do
			echo "--- $target ($pkg)"
			fuzz "$dir" "$pkg" "$bin" "$target"
		done
	done
else
	echo "skipped (FUZZTIME=0)"
fi
rm -rf "$fuzzbin"
fuzzbin=

step "vulnerability audit: scripts/vulncheck.sh (govulncheck, offline database)"
./scripts/vulncheck.sh

step "end-to-end: scripts/verify.sh"
./scripts/verify.sh

printf '    (stage %d took %d s)\n' "$stage" $((SECONDS - stage_start))
printf '\nall tests passed in %d min %d s\n' $(((SECONDS - run_start) / 60)) $(((SECONDS - run_start) % 60))
