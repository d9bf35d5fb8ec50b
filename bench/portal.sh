#!/usr/bin/env bash
# Captive portals in the namespace lab (root): how long Roam takes to report a portal, the time
# from the portal opening (a login through `agent portal --run curl`) to the first echo through the
# tunnel, and the connectivity checks a laptop left idle behind a closed portal makes per hour on
# mains and on battery. No peer runs here: WireGuard and OpenVPN clients have no portal handling.
# Usage: sudo bench/portal.sh [--rounds 3]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "portal: needs root (network namespaces, TUN devices)" >&2; exit 2; }
scripts/setup
source bench/lab.sh
echo "portal: building (release)" >&2
bin=$(scripts/build agent PortalBenchmark)
lab_run "$bin/PortalBenchmark" "$@"
