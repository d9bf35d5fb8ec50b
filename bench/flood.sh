#!/usr/bin/env bash
# Handshake floods in the namespace lab (root): spoofed initiations (random sources, raw sockets),
# direct ones (the attacker's own address), and ones from the 256 /64s of one IPv6 /56 (v6-56) and
# from 64 IPv4 /24s (v4-24s), all but the spoofed answering every cookie reply, at 1,000 and 10,000
# a second against `agent serve`, while `agent up` (full tunnel) roams between its uplinks with a
# probe through the tunnel every 20 ms, two other users (a key user and a password user) handshake
# every 400 ms, and 16 users with sessions rekey once a second each. Prints per flood: the real
# handshakes that completed within a second, their median and longest time, the probes lost, the
# server's CPU, the 16 users' completed handshakes per second, and the cookies the attacker
# answered. Usage: sudo bench/flood.sh [--rates 1000,10000] [--seconds 10] [--kinds none,spoofed,direct,v6-56,v4-24s,users] [--users N] [--still] [--logs]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "flood: needs root (network namespaces, TUN devices, raw sockets)" >&2; exit 2; }
scripts/setup
source bench/lab.sh
echo "flood: building (release)" >&2
bin=$(scripts/build agent FloodBenchmark)
echo "flood: $(nproc) cores, $(uname -r)" >&2
lab_run "$bin/FloodBenchmark" "$@"
