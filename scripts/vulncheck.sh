#!/usr/bin/env bash
# vulncheck.sh audits every module of the workspace for known
# vulnerabilities with govulncheck (golang.org/x/vuln), offline.
#
# The public vulnerability database is not reachable from this project's
# machines, so the script builds one: it fetches the golang.org/x/vulndb
# module through the Go module proxy (its data/osv folder holds every Go
# vulnerability report as an OSV file) and turns that folder into the
# database layout `govulncheck -db file://DIR` reads (index/db.json,
# index/modules.json, index/vulns.json, ID/GO-YYYY-NNNN.json) with vulndb's
# own tool for that, cmd/indexdb. The tools and the database are cached
# under .cache/vulncheck (ignored by git; IDEM_VULNCHECK_CACHE moves it),
# keyed by the pinned versions: to take newer vulnerability data, bump
# VULNDB_VERSION (`go list -m -versions golang.org/x/vulndb` lists none:
# it is a pseudo-version; `go list -m golang.org/x/vulndb@master` names the
# newest).
#
# It fails when a vulnerability affects idem's code paths (govulncheck
# found a call into a vulnerable symbol) unless that finding is accepted in
# scripts/vulncheck-accepted.txt for the Go version in use. Vulnerabilities
# in modules idem requires but never calls are reported and do not fail.
#
# Time: about 40 s with warm caches on the 2-core machine; the first run on
# a new machine also downloads and compiles the tools (1 to 2 minutes).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

VULN_VERSION=v1.9.0
VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018

cache=${IDEM_VULNCHECK_CACHE:-$root/.cache/vulncheck}
bin=$cache/bin-$VULN_VERSION-$VULNDB_VERSION
db=$cache/db-$VULNDB_VERSION
mkdir -p "$cache"

# The tools are built outside the workspace with their own module graphs.
tool() { (cd "$cache" && GOFLAGS= GOWORK=off GOBIN="$bin" go install "$@"); }
[[ -x "$bin/govulncheck" ]] || tool "golang.org/x/vuln/cmd/govulncheck@$VULN_VERSION"
if [[ ! -f "$db/index/modules.json" ]]; then
	[[ -x "$bin/indexdb" ]] || tool "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION"
	src=$(cd "$cache" && GOFLAGS= GOWORK=off go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	if [[ -z "$src" || ! -d "$src/data/osv" ]]; then
		echo "vulncheck: golang.org/x/vulndb@$VULNDB_VERSION has no data/osv folder" >&2
		exit 1
	fi
	rm -rf "$db.tmp"
	"$bin/indexdb" -vulns "$src/data/osv" -out "$db.tmp"
	mv "$db.tmp" "$db"
fi

goversion=$(go env GOVERSION)
echo "govulncheck $VULN_VERSION, database golang.org/x/vulndb@$VULNDB_VERSION, $goversion"

# One run over every module of the workspace (go.work): the call graph is
# built once, which is three times faster than a run per module.
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
"$bin/govulncheck" -db "file://$db" github.com/idemhq/idem/... >"$out" 2>&1 || rc=$?
if [[ $rc -ne 0 && $rc -ne 3 ]]; then
	cat "$out"
	echo "vulncheck: govulncheck failed (exit $rc)" >&2
	exit 1
fi

# In its default text output govulncheck numbers ("Vulnerability #N: ID")
# exactly the findings whose vulnerable symbols idem's code reaches.
accepted=scripts/vulncheck-accepted.txt
failed=0
while read -r id; do
	[[ -z "$id" ]] && continue
	if awk -v id="$id" -v gv="$goversion" '$1 == id && ($2 == gv || $2 == "any") { found = 1 } END { exit !found }' "$accepted"; then
		echo "accepted: $id ($(awk -v id="$id" -v gv="$goversion" '$1 == id && ($2 == gv || $2 == "any") { $1 = ""; $2 = ""; sub(/^ +/, ""); print; exit }' "$accepted"))"
	else
		echo "NOT ACCEPTED: $id affects idem's code"
		failed=1
	fi
done < <(sed -n 's/^Vulnerability #[0-9]*: \(GO-[0-9]*-[0-9]*\).*/\1/p' "$out" | sort -u)

if [[ $failed -ne 0 ]]; then
	echo
	cat "$out"
	echo
	echo "vulncheck: idem's code reaches a known vulnerability (details above). Upgrade the module" >&2
	echo "(scripts/tidy.sh MODULE_DIR go get MODULE@FIXED) or, for the standard library, the Go" >&2
	echo "toolchain; accept a finding only with a reason, in $accepted." >&2
	exit 1
fi
tail -n 4 "$out"
echo "vulncheck: no unaccepted vulnerability reaches idem's code"
