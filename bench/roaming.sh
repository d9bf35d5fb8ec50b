#!/usr/bin/env bash
# Roaming in the namespace lab (root): every scenario (uplink loss, better path, address change, a
# refused bind after one, silent blackhole, flap storm, suspend/resume, server restart, both uplinks down, and a steady
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
source bench/lab.sh
lab_packages roaming wireguard-go wireguard-tools
echo "roaming: building (release)" >&2
bin=$(scripts/build agent RoamingBenchmark)
echo "roaming: $(nproc) cores, $(uname -r), wireguard-go $(wireguard-go --version 2>/dev/null | head -1 | awk '{print $NF}')" >&2
lab_run "$bin/RoamingBenchmark" "$@"
