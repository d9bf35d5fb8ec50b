#!/usr/bin/env bash
# Several clients through one gateway (root): N real `agent up` processes (default 4), each in a
# namespace of its own, one iperf3 TCP stream each through one `agent serve`, upload then download,
# then the same through wireguard-go (one server, a peer per client) and over the raw veths.
# Prints the aggregate and per-client Mbit/s and the server's CPU.
# Usage: sudo bench/gateway.sh [--clients 4] [--seconds 10]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "gateway: needs root (network namespaces, TUN devices)" >&2; exit 2; }
scripts/setup
source bench/lab.sh
lab_packages gateway iperf3 wireguard-go wireguard-tools
bin=$(scripts/build agent GatewayBenchmark)
lab_run "$bin/GatewayBenchmark" "$@"
