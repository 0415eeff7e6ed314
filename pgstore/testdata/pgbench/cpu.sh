#!/bin/bash
# PostgreSQL CPU per pgbench transaction (claim + completion of a new key):
# the postmaster's children's user+system time (they are reaped when
# pgbench disconnects), over 8 clients x 2,000 transactions.
#   psql -h 127.0.0.1 -U postgres test -f setup.sql
#   for i in 1 2 3; do for f in first_*.sql; do ./cpu.sh $f; done; done
set -eu
pm=$(pgrep -o -x postgres) # the postmaster: the oldest postgres process
cpu() { set -- $(cut -d' ' -f16,17 /proc/$pm/stat); echo $(($1 + $2)); }
hz=$(getconf CLK_TCK)
a=$(cpu)
pgbench -h 127.0.0.1 -U postgres -n -M prepared -c 8 -j 2 -t 2000 -f "$1" test >/dev/null
sleep 1 # let the postmaster reap the backends
b=$(cpu)
echo "$1: $(( (b - a) * 1000000 / hz / 16000 )) µs per transaction"
