#!/usr/bin/env bash
# A gateway whose users come from PostgreSQL (root): a throwaway PostgreSQL (Unix socket only) with
# N key users (default 100,000), and `agent serve` in a namespace of its own reading them
# (users-from). Prints the start-up time, the gateway's RSS, its idle wake-ups with the
# subscription open, how long one user's UPDATE takes to be applied (and a change to every user),
# and the start-up from the snapshot with the database stopped.
# Usage: sudo bench/directory.sh [users]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "directory: needs root (a network namespace, a TUN device, PostgreSQL as its user)" >&2; exit 2; }
users=${1:-100000}
scripts/setup
bin=$(scripts/build agent)
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
work=$(mktemp -d /tmp/roam-bench-directory.XXXXXX)
ns=roam-bench-directory-$$
gateway=
pg() { runuser -u postgres -- "$pgbin/$1" "${@:2}"; }
sql() { psql -h "$work/run" -U postgres -d roam -v ON_ERROR_STOP=1 -qAt "$@"; }
cleanup() {
    [ -z "$gateway" ] || { kill -TERM "$gateway" 2>/dev/null && wait "$gateway" 2>/dev/null || true; }
    pg pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT

mkdir -p "$work/data" "$work/run"
chown postgres "$work/data" "$work/run"
chmod 755 "$work"
pg initdb -D "$work/data" -U postgres --auth=trust --no-sync -E UTF8 >/dev/null
pg pg_ctl -D "$work/data" -w -l "$work/run/postgres.log" -o "-k $work/run -c listen_addresses='' -c fsync=off" start >/dev/null
pg createdb -h "$work/run" -U postgres roam
for migration in contrib/sql/0*.sql; do sql -f "$migration"; done
started=$(date +%s%N)
sql -c "INSERT INTO roam_users (name, public_key, addresses)
        SELECT 'user' || i, encode(sha256(int4send(i)), 'base64'), ARRAY[('100.64.0.1'::inet + i)]
        FROM generate_series(1, $users) AS i"
echo "directory: $users users inserted in $(( ($(date +%s%N) - started) / 1000000 )) ms"

"$bin/agent" keygen --out "$work/server.key" >/dev/null
install -m 600 /dev/null "$work/server.yaml"
cat > "$work/server.yaml" <<EOF
listen-port: 51820
private-key-file: $work/server.key
tunnel: {name: roambench0, addresses: [100.64.0.1/10]}
users-from:
  url: "postgresql://postgres@/roam?host=$work/run"
  snapshot: $work/users.snapshot
EOF
ip netns add "$ns"
ip -n "$ns" link set lo up

# Starts the gateway; $took is the milliseconds until it serves.
serve() {
    : > "$work/gateway.log"
    local t0 i
    t0=$(date +%s%N)
    ip netns exec "$ns" "$bin/agent" serve --config "$work/server.yaml" --control "$work/control.sock" >> "$work/gateway.log" 2>&1 &
    gateway=$!
    for i in $(seq 1 1200); do
        grep -q "msg=serving" "$work/gateway.log" && break
        kill -0 "$gateway" 2>/dev/null || { cat "$work/gateway.log" >&2; exit 1; }
        sleep 0.05
    done
    grep -q "msg=serving" "$work/gateway.log" || { echo "directory: the gateway did not serve within 60 s" >&2; exit 1; }
    took=$(( ($(date +%s%N) - t0) / 1000000 ))
}
rss() { awk '/^VmRSS/ {print $2 / 1024 " MB"}' "/proc/$gateway/status"; }
switches() { cat /proc/"$gateway"/task/*/status | awk '/^(voluntary|nonvoluntary)_ctxt_switches/ {n += $2} END {print n}'; }
# Waits for the next "users changed" line and prints its took= and the wall time since $1 (ns).
changed() {
    local before=$1 since=$2 i
    for i in $(seq 1 600); do
        [ "$(grep -c 'msg="users changed"' "$work/gateway.log")" -gt "$before" ] && break
        sleep 0.01
    done
    local line
    line=$(grep 'msg="users changed"' "$work/gateway.log" | tail -1)
    echo "applied $(( ($(date +%s%N) - since) / 1000000 )) ms after the statement began (at most; polled every 10 ms); the gateway's own $(grep -o 'took=[^ ]*' <<< "$line")"
}

serve
echo "directory: start-up with $users users from PostgreSQL: $took ms to serving ($(grep -o 'msg="user directory read".*' "$work/gateway.log"))"
for i in $(seq 1 100); do [ -f "$work/users.snapshot" ] && break; sleep 0.05; done
sleep 1
echo "directory: RSS $(rss), snapshot $(( $(stat -c %s "$work/users.snapshot") / 1024 )) KiB, mode $(stat -c %a "$work/users.snapshot")"
a=$(switches); sleep 10; b=$(switches)
echo "directory: idle with the subscription open: $(( b - a )) context switches in 10 s (all threads)"
n=$(grep -c 'msg="users changed"' "$work/gateway.log" || true)
t=$(date +%s%N); sql -c "UPDATE roam_users SET enabled = false WHERE name = 'user$(( (users + 1) / 2 ))'"
echo "directory: one user disabled: $(changed "$n" "$t")"
n=$(grep -c 'msg="users changed"' "$work/gateway.log" || true)
t=$(date +%s%N); sql -c "UPDATE roam_users SET search_domains = '{corp.example}'"
echo "directory: every user changed in one statement: $(changed "$n" "$t")"
sleep 5  # the snapshot is written, and the old tables let go, a second or so after the last change
echo "directory: RSS after the changes $(rss)"

kill -TERM "$gateway"; wait "$gateway" 2>/dev/null || true; gateway=
pg pg_ctl -D "$work/data" -w -m fast stop >/dev/null
serve
echo "directory: start-up from the snapshot, database stopped: $took ms to serving"
grep -q "serving the snapshot" "$work/gateway.log" || { echo "directory: the gateway did not say it serves the snapshot" >&2; exit 1; }
echo "directory: RSS $(rss)"
