#!/usr/bin/env bash
# encryption-serve.sh: what --encryption-keys costs `idem serve` as a process.
# Two `idem serve` processes on SQLite files of their own, one with a
# one-key keyring, loaded in turn with wrk (Debian package wrk) for ROUNDS
# rounds of DURATION each: first executions (a new key per request) and
# replays (one completed key). Prints req/s per round and mode; compare the
# modes round by round, since the machine's load moves between rounds.
#
#   bench/scripts/encryption-serve.sh            # ROUNDS=3 DURATION=5s
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rounds=${ROUNDS:-3}
duration=${DURATION:-5s}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
(cd "$root" && go build -o "$dir/idem" ./cmd/idem)
echo "1:$(head -c 32 /dev/urandom | base64)" >"$dir/keys"
cat >"$dir/first.lua" <<'LUA'
local counter = 0
function setup(thread) counter = counter + 1; thread:set("tid", counter) end
function init(args) tid = wrk.thread:get("tid"); run = os.getenv("RUN") or "r"; n = 0 end
function request()
  n = n + 1
  return wrk.format("POST", "/api/payments",
    {["Content-Type"] = "application/json", ["Idempotency-Key"] = '"' .. run .. "-" .. tid .. "-" .. n .. '"'},
    '{"amountCents":2599,"currency":"USD","reference":"order-1001"}')
end
LUA
cat >"$dir/replay.lua" <<'LUA'
wrk.method = "POST"
wrk.path = "/api/payments"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = '"replay-' .. (os.getenv("RUN") or "r") .. '"'
wrk.body = '{"amountCents":2599,"currency":"USD","reference":"order-1001"}'
LUA
"$dir/idem" serve --addr 127.0.0.1:18081 --db "$dir/plain.db" --access-log=false >"$dir/plain.log" 2>&1 &
"$dir/idem" serve --addr 127.0.0.1:18082 --db "$dir/enc.db" --access-log=false --encryption-keys "$dir/keys" >"$dir/enc.log" 2>&1 &
for _ in $(seq 100); do
	curl -sf 127.0.0.1:18081/healthz >/dev/null && curl -sf 127.0.0.1:18082/healthz >/dev/null && break
	sleep 0.1
done
for round in $(seq "$rounds"); do
	for path in first replay; do
		for mode in plain encrypted; do
			port=18081
			[[ $mode == encrypted ]] && port=18082
			out=$(RUN="$mode-$round" wrk -t2 -c8 -d"$duration" -s "$dir/$path.lua" "http://127.0.0.1:$port")
			rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
			bad=$(awk '/Non-2xx/ {print $5}' <<<"$out")
			echo "round=$round path=$path mode=$mode req/s=$rps non-2xx=${bad:-0}"
		done
	done
done
