#!/usr/bin/env bash
# Decision-core throughput: a generated 24 h timeline (one event per second) replayed through
# NetworkModel + Reconnector. Prints wall time and facts per second.
# Usage: bench/replay.sh [hours] [seed]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup
"$(scripts/build ReplayBenchmark)/ReplayBenchmark" "$@"
