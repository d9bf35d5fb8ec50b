#!/usr/bin/env bash
# The server's protocol core at gateway scale, in one process (no root, no network): the users
# database and core for N key users (default 10,000), a handshake for each (the server's side
# timed), the memory the live sessions hold, and an established session's packet cost with all
# of them in the tables. Usage: bench/sessions.sh [users]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup
bin=$(scripts/build SessionBenchmark)
"$bin/SessionBenchmark" "$@"
