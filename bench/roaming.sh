#!/usr/bin/env bash
# Roaming in the namespace lab (root): every scenario (uplink loss, better path, address change,
# silent blackhole, flap storm, suspend/resume, server restart, both uplinks down, and a steady
# baseline) on Roam and on Debian's wireguard-go, in full-tunnel and split mode, with a probe through
# the tunnel every 20 ms. Prints per run: the longest gap in echoes (outage), probes lost, handshakes
# the server saw, Roam's reconnect attempts, the client's CPU, and for better-path the time until the
# probes arrived over eth0; then the idle Roam client's wakeups over a minute and its memory.
# Usage: sudo bench/roaming.sh [RoamingBenchmark options: --only roam|wireguard-go --mode full|split
#                              --scenario NAME --idle SECONDS --logs]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "roaming: needs root (network namespaces, TUN devices)" >&2; exit 2; }
scripts/setup
missing=()
for p in wireguard-go wireguard-tools; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "roaming: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "roaming: building (release)" >&2
bin=$(scripts/build agent RoamingBenchmark)
echo "roaming: $(nproc) cores, $(uname -r), wireguard-go $(wireguard-go --version 2>/dev/null | head -1 | awk '{print $NF}')" >&2
# Every lab the benchmark makes is deleted when its run ends, also on failure; on Ctrl-C this
# script ends the processes inside the benchmark's own namespaces (roamtest-PID-*) and deletes them.
"$bin/RoamingBenchmark" "$@" &
bench=$!
cleanup() {
    local rc=$? ns pid
    trap - EXIT INT TERM
    kill -TERM "$bench" 2>/dev/null && wait "$bench" 2>/dev/null || true
    for ns in $(ip netns list | awk '{print $1}' | grep "^roamtest-$bench-" || true); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
        sleep 0.5
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -f /run/wireguard/wg[sl]"$((bench % 100000))"x*.sock
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
wait "$bench"
