#!/usr/bin/env bash
# Several clients through one gateway (root): N real `agent up` processes (default 4), each in a
# namespace of its own, one iperf3 TCP stream each through one `agent serve`, upload then download,
# then the same through wireguard-go (one server, a peer per client) and over the raw veths. Prints the aggregate and per-client Mbit/s and the server's CPU.
# Usage: sudo bench/gateway.sh [--clients 4] [--seconds 10]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "gateway: needs root (network namespaces, TUN devices)" >&2; exit 2; }
scripts/setup
missing=()
for p in iperf3 wireguard-go wireguard-tools; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "gateway: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
bin=$(scripts/build agent GatewayBenchmark)
"$bin/GatewayBenchmark" "$@" &
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
    rm -f /run/wireguard/wg[sl]"$((bench % 100000))"*.sock
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
wait "$bench"
