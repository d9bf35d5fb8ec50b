#!/usr/bin/env bash
# Live path monitor against a real kernel (root): change-to-event latency p50/p99 over 1,000
# changes, dump and resync with 10,000 routes, idle RSS and wake-ups of `agent monitor`.
# Usage: sudo bench/monitor.sh [changes] [routes]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup
bin=$(scripts/build agent MonitorBenchmark)
"$bin/MonitorBenchmark" "$@"
