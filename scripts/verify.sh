#!/usr/bin/env bash
# verify.sh builds idem, runs `idem serve` on a fresh SQLite file and checks
# the retry-safety contract over real HTTP, one line per check:
# missing key, first execution, exact replay, reused key, in-flight
# duplicates, a kill -9 in the middle of an operation followed by a
# restart, replay after a clean restart, and the final payment count.
# It exits non-zero on the first failure. Needs: go, curl.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
pid=""
cleanup() {
	# wait reaps the killed server here, so that bash reports no "Killed"
	# job after the last line.
	if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
		kill -9 "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

fail() {
	echo "FAIL  $*"
	if [[ -f "$work/server.log" ]]; then
		echo "---- server log (last 20 lines) ----"
		tail -n 20 "$work/server.log"
	fi
	exit 1
}
pass() { echo "ok    $*"; }

(cd "$root/cmd/idem" && go build -o "$work/idem" .) || fail "build"
db="$work/payments.db"
lease=2s
url=""

# start launches `idem serve` on a free port (port 0) and waits until it
# answers /healthz.
start() {
	"$work/idem" serve --addr 127.0.0.1:0 --db "$db" --lease "$lease" --op-delay "$1" --log-format json \
		>>"$work/server.log" 2>&1 &
	pid=$!
	local addr=""
	for _ in $(seq 1 200); do
		# One read of the log for both the count and the address, so that
		# a line written between two reads cannot pair an old address with
		# a new count.
		local lines
		lines=$(grep -o '"msg":"idem serve listening","addr":"[^"]*"' "$work/server.log" || true)
		if [[ -n "$lines" ]] && [[ "$(wc -l <<<"$lines")" -ge "$starts" ]]; then
			addr=$(tail -n 1 <<<"$lines" | sed 's/.*"addr":"\([^"]*\)"/\1/')
			break
		fi
		kill -0 "$pid" 2>/dev/null || fail "idem serve exited at start"
		sleep 0.05
	done
	url="http://$addr"
	for _ in $(seq 1 200); do
		if curl -fsS "$url/healthz" >/dev/null 2>&1; then return; fi
		sleep 0.05
	done
	fail "idem serve did not become healthy at $url"
}
starts=0

# pay KEY BODY [OUTFILE]: POST a payment; prints the status code, saves the
# headers in OUTFILE.h and the body in OUTFILE.b.
pay() {
	local key=$1 body=$2 out=${3:-$work/last}
	local args=(-sS -o "$out.b" -D "$out.h" -w '%{http_code}' -X POST "$url/api/payments"
		-H 'Content-Type: application/json' --data "$body")
	if [[ -n "$key" ]]; then args+=(-H "Idempotency-Key: \"$key\""); fi
	curl "${args[@]}"
}
header() { grep -i "^$2:" "$1.h" | head -n 1 | cut -d' ' -f2- | tr -d '\r'; }
count() { curl -fsS "$url/api/payments/count" | sed 's/[^0-9]//g'; }
# await_running: wait until an operation is executing (the server's
# idem_operations_in_flight gauge), so that duplicates really meet it.
await_running() {
	for _ in $(seq 1 200); do
		if curl -fsS "$url/metrics" | grep -q '^idem_operations_in_flight [1-9]'; then return 0; fi
		sleep 0.02
	done
	return 1
}

order='{"amountCents":2599,"currency":"USD","reference":"order-1001"}'
starts=1
start 3s

# 1. A required key is missing: 400 before anything runs.
code=$(pay "" "$order")
[[ "$code" == 400 ]] && grep -q '"code":"idempotency.key_missing"' "$work/last.b" || fail "missing key: got $code"
pass "missing key: 400 idempotency.key_missing"

# 2. First execution.
code=$(pay order-1001 "$order" "$work/first")
[[ "$code" == 201 ]] || fail "first execution: got $code"
[[ "$(header "$work/first" Idempotency-Replayed)" == false ]] || fail "first execution: not marked Idempotency-Replayed: false"
pass "first execution: 201, Idempotency-Replayed: false"

# 3. A completed retry replays the exact bytes (the payment currency in lower
# case is the same request: payloads are normalised before fingerprinting).
code=$(pay order-1001 '{"currency":"usd","reference":"order-1001","amountCents":2599}' "$work/retry")
[[ "$code" == 201 ]] || fail "completed retry: got $code"
cmp -s "$work/first.b" "$work/retry.b" || fail "completed retry: body differs from the first response"
[[ "$(header "$work/retry" Idempotency-Replayed)" == true ]] || fail "completed retry: not marked Idempotency-Replayed: true"
[[ "$(header "$work/retry" Location)" == "$(header "$work/first" Location)" ]] || fail "completed retry: Location differs"
pass "completed retry: 201, identical bytes, Idempotency-Replayed: true"

# 4. The same key with another payload.
code=$(pay order-1001 '{"amountCents":9999,"currency":"USD","reference":"order-1001"}')
[[ "$code" == 422 ]] && grep -q '"code":"idempotency.key_reused"' "$work/last.b" || fail "different payload: got $code"
pass "different payload: 422 idempotency.key_reused"

# 5. Five duplicates while the owner runs (op-delay 3s): each gets 409 with
# Retry-After, then the owner's response is replayed.
dup='{"amountCents":500,"currency":"EUR","reference":"concurrent"}'
pay order-2002 "$dup" "$work/owner" >"$work/owner.code" &
owner=$!
await_running || fail "concurrent duplicates: the owner was never seen running"
dups=()
for i in 1 2 3 4 5; do
	pay order-2002 "$dup" "$work/dup$i" >"$work/dup$i.code" &
	dups+=($!)
done
wait "${dups[@]}" "$owner"
conflicts=0
for i in 1 2 3 4 5; do
	c=$(cat "$work/dup$i.code")
	if [[ "$c" == 409 ]] && [[ -n "$(header "$work/dup$i" Retry-After)" ]]; then conflicts=$((conflicts + 1)); fi
done
[[ "$(cat "$work/owner.code")" == 201 ]] || fail "concurrent duplicates: owner got $(cat "$work/owner.code")"
[[ "$conflicts" == 5 ]] || fail "concurrent duplicates: $conflicts of 5 got 409 with Retry-After (got: $(cat "$work"/dup?.code | tr '\n' ' '))"
code=$(pay order-2002 "$dup" "$work/after")
[[ "$code" == 201 ]] && cmp -s "$work/owner.b" "$work/after.b" || fail "concurrent duplicates: no replay after the owner finished"
pass "concurrent duplicates: 5 x 409 with Retry-After while the owner ran, then replay"

# 6. kill -9 in the middle of an operation, then a restart: the dead
# attempt leaves no payment; after its lease the retry executes once.
before=$(count)
crash='{"amountCents":777,"currency":"USD","reference":"crash"}'
pay order-3003 "$crash" "$work/doomed" >/dev/null 2>&1 &
doomed=$!
await_running || fail "crash: the operation was never seen running"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
wait "$doomed" 2>/dev/null || true
starts=2
start 0s
[[ "$(count)" == "$before" ]] || fail "crash: the killed operation left a payment"
code=$(pay order-3003 "$crash" "$work/recovered")
attempts=1
while [[ "$code" == 409 ]] && [[ $attempts -lt 200 ]]; do # the dead owner's lease runs out
	sleep 0.05
	code=$(pay order-3003 "$crash" "$work/recovered")
	attempts=$((attempts + 1))
done
[[ "$code" == 201 ]] || fail "crash: retry after the lease got $code"
[[ "$(header "$work/recovered" Idempotency-Replayed)" == false ]] || fail "crash: the retry was a replay"
code=$(pay order-3003 "$crash" "$work/recovered2")
[[ "$code" == 201 ]] && cmp -s "$work/recovered.b" "$work/recovered2.b" || fail "crash: second retry did not replay"
[[ "$(count)" == $((before + 1)) ]] || fail "crash: $(count) payments, want $((before + 1))"
pass "kill -9 mid-operation and restart: no payment left behind; the retry executed exactly once"

# 7. A clean restart (SIGTERM) keeps records: the first payment replays.
kill -TERM "$pid"
wait "$pid" || fail "graceful shutdown: exit status $?"
starts=3
start 0s
code=$(pay order-1001 "$order" "$work/persisted")
[[ "$code" == 201 ]] && cmp -s "$work/first.b" "$work/persisted.b" || fail "replay after restart: got $code"
[[ "$(header "$work/persisted" Idempotency-Replayed)" == true ]] || fail "replay after restart: not a replay"
pass "replay after a clean restart: 201, identical bytes"

# 8. Final count: three keys executed, no retry added a row.
n=$(count)
[[ "$n" == 3 ]] || fail "payment count: $n, want 3"
pass "payment count: $n (three keys, every retry replayed)"
kill -TERM "$pid"
wait "$pid" || fail "graceful shutdown: exit status $?"
pid=""
echo "All idempotency checks passed."
