# Shared by the benchmark scripts (sourced, not run): Debian packages a benchmark needs, and a
# benchmark executable run with the namespace lab cleaned up after it, also on Ctrl-C.

# Installs the Debian packages among "$@" that are missing. The first argument names the caller.
lab_packages() {
    local who=$1 p missing=()
    shift
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "$who: installing ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# Runs the benchmark executable "$@" and waits for it. Every lab it makes is deleted when its run
# ends, also on failure; on Ctrl-C or TERM this ends the processes inside the benchmark's own
# namespaces (roamtest-PID-*), deletes them, and removes its wireguard-go control sockets.
lab_run() {
    "$@" &
    lab_bench=$!
    trap lab_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    wait "$lab_bench"
}

lab_cleanup() {
    local rc=$? ns pid
    trap - EXIT INT TERM
    kill -TERM "$lab_bench" 2>/dev/null && wait "$lab_bench" 2>/dev/null || true
    for ns in $(ip netns list | awk '{print $1}' | grep "^roamtest-$lab_bench-" || true); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$pid" 2>/dev/null || true; done
        sleep 0.5
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -f /run/wireguard/wg[sl]"$((lab_bench % 100000))"*.sock
    exit "$rc"
}
