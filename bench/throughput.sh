#!/usr/bin/env bash
# Tunnel throughput in the namespace lab (root): one TCP stream with iperf3, upload and download
# (-R), laptop namespace to server namespace, over three paths: raw veths (the ceiling), Roam
# (`agent serve` / `agent up`, split mode) and wireguard-go (userspace WireGuard) on the same topology.
# For Roam and wireguard-go also the client process's CPU time per Gbit, and the idle Roam client's RSS.
# Usage: sudo bench/throughput.sh            (DURATION=seconds per run, default 10)
#        MODE=full LOCKDOWN=off sudo bench/throughput.sh   (Roam's routing mode, split by default,
#        and its lockdown firewall, on by default: compare on and off for what the lockdown costs)
#        In full mode also from a container behind a bridge on the laptop, as Docker sets one up
#        (a veth into its namespace, masquerade): forwarded traffic through the tunnel beside the
#        laptop's own.
#        PROTOCOL=2 or CIPHER=chacha20-poly1305 sudo bench/throughput.sh   (Roam's protocol version,
#        3 by default, and for version 3 a pinned cipher; negotiated by default: AES-256-GCM where
#        both ends have AES in hardware)
#        TRANSPORT=tcp sudo bench/throughput.sh   (also Roam over its stream transport, TLS on TCP
#        port 443, with the router dropping UDP to the server so the agent falls back to it, and
#        OpenVPN over TCP on the same path; LOSS=1 drops that percentage of packets at random at the
#        router, both ways, for every row)
#        PERF=1 sudo bench/throughput.sh   (also where Roam's client spends its CPU in each run: the
#        25 symbols perf samples most)
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
MODE=${MODE:-split}
LOCKDOWN=${LOCKDOWN:-on}
PROTOCOL=${PROTOCOL:-3}
CIPHER=${CIPHER:-}
TRANSPORT=${TRANSPORT:-udp}
LOSS=${LOSS:-0}
PERF=${PERF:-0}
[[ $TRANSPORT =~ ^(udp|tcp)$ ]] || { echo "throughput: TRANSPORT is udp or tcp" >&2; exit 2; }
[[ $LOSS =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "throughput: LOSS is a percentage, e.g. 1" >&2; exit 2; }
[[ $PROTOCOL =~ ^(2|3)$ ]] || { echo "throughput: PROTOCOL is 2 or 3" >&2; exit 2; }
[[ $CIPHER =~ ^(|aes-256-gcm|chacha20-poly1305)$ ]] || { echo "throughput: CIPHER is aes-256-gcm or chacha20-poly1305" >&2; exit 2; }
[[ $MODE =~ ^(split|full)$ ]] || { echo "throughput: MODE is split or full" >&2; exit 2; }
[[ $LOCKDOWN =~ ^(on|off)$ ]] || { echo "throughput: LOCKDOWN is on or off" >&2; exit 2; }
[[ $DURATION =~ ^[1-9][0-9]*$ ]] || { echo "throughput: DURATION must be a positive integer" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "throughput: needs root (network namespaces, TUN devices)" >&2; exit 2; }

# --- packages and build ------------------------------------------------------------------------
scripts/setup
source bench/lab.sh
lab_packages throughput iperf3 wireguard-go wireguard-tools $([ "$TRANSPORT" = tcp ] && echo openvpn)
command -v python3 >/dev/null || { echo "throughput: needs python3" >&2; exit 2; }

echo "throughput: building agent (release)" >&2
A=$(scripts/build agent)/agent
[ -x "$A" ] || { echo "throughput: no agent binary at $A" >&2; exit 1; }

# --- lab and cleanup ---------------------------------------------------------------------------
prefix=rbench$$
L=$prefix-laptop S=$prefix-server C=$prefix-container
# wireguard-go's control socket is /run/wireguard/IFACE.sock, shared by every network namespace:
# the two ends (and any concurrent run) need distinct interface names.
WGS=wgs$$ WGL=wgl$$
WORK=$(mktemp -d /tmp/rbench.XXXXXX)
chmod 700 "$WORK"
pids=()
started=$(date +%s)

stop_pid() {  # SIGTERM, up to 5 s, then SIGKILL; only the given PID, which then leaves the list
    local pid=$1 i rest=()
    for i in "${pids[@]}"; do [ "$i" = "$pid" ] || rest+=("$i"); done
    pids=("${rest[@]}")
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${pids[@]}"; do stop_pid "$pid"; done  # stop_pid edits pids; the loop has its own copy
    scripts/lab down "$prefix" || true
    ip netns del "$C" 2>/dev/null || true
    rm -f "/run/wireguard/$WGS.sock" "/run/wireguard/$WGL.sock"
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

scripts/lab up "$prefix" >/dev/null
R=$prefix-router
if [ "$LOSS" != 0 ]; then
    # This kernel may have no netem: nftables drops at random in the router's forward hook, both ways.
    permille=$(python3 -c 'import sys; print(round(float(sys.argv[1]) * 10))' "$LOSS")
    ip netns exec "$R" nft -f - <<NFT
table inet benchloss {
    chain forward { type filter hook forward priority -10; numgen random mod 1000 < $permille counter drop; }
}
NFT
fi

# wait_for TRIES DESCRIPTION COMMAND...: retry every 0.1 s, at most TRIES times
wait_for() {
    local tries=$1 what=$2 i
    shift 2
    for ((i = 0; i < tries; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "throughput: timed out waiting for $what" >&2
    return 1
}

alive() { kill -0 "$1" 2>/dev/null; }
die_with_log() {  # message log-file...
    local msg=$1 f
    shift
    echo "throughput: $msg" >&2
    for f in "$@"; do [ -s "$f" ] && { echo "--- $f" >&2; tail -n 30 "$f" >&2; }; done
    exit 1
}

ip netns exec "$S" iperf3 -s >"$WORK/iperf3-server.log" 2>&1 &
pids+=($!)
wait_for 100 "the iperf3 server" sh -c "ip netns exec $S ss -Hltn 'sport = :5201' | grep -q 5201"

# --- measurement helpers -----------------------------------------------------------------------
TICK=$(getconf CLK_TCK)
cpu_ticks() {  # utime+stime of PID (all threads), in clock ticks
    python3 - "$1" <<'EOF'
import sys
stat = open(f"/proc/{sys.argv[1]}/stat").read()
fields = stat[stat.rindex(")") + 2:].split()   # fields[0] is field 3 (state)
print(int(fields[11]) + int(fields[12]))        # utime (14), stime (15)
EOF
}

# run_iperf NAME TARGET [-R]: writes $WORK/NAME.json; prints "mbit bytes retransmits" (receiver side);
# from the namespace $FROM (the laptop's unless set)
run_iperf() {
    local name=$1 target=$2
    shift 2
    if ! timeout $((DURATION + 30)) ip netns exec "${FROM:-$L}" iperf3 -c "$target" -t "$DURATION" -P 1 --json "$@" \
        >"$WORK/$name.json" 2>"$WORK/$name.err"; then
        echo "throughput: iperf3 $name failed" >&2
        cat "$WORK/$name.err" >&2 || true
        python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("error", ""))' "$WORK/$name.json" >&2 || true
        return 1
    fi
    python3 - "$WORK/$name.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
if "error" in r:
    sys.exit("iperf3: " + r["error"])
s = r["end"]["sum_received"]
print(f'{s["bits_per_second"] / 1e6:.0f} {s["bytes"]} {r["end"]["sum_sent"].get("retransmits", "-")}')
EOF
}

declare -A UP DOWN CPU_S CPU_UP CPU_DOWN

# measure PATH TARGET [CLIENT_PID]: both directions; with a PID, that process's CPU per Gbit
measure() {
    local path=$1 target=$2 pid=${3:-} dir flag out mbit bytes retr t0 t1 secs per
    for dir in up down; do
        flag=()
        [ "$dir" = down ] && flag=(-R)
        [ -n "$pid" ] && t0=$(cpu_ticks "$pid")
        local perf=""
        if [ -n "$pid" ] && [ "$PERF" = 1 ]; then
            perf record -q -F 999 -p "$pid" -o "$WORK/perf-$path-$dir.data" >/dev/null 2>&1 & perf=$!
        fi
        out=$(run_iperf "$path-$dir" "$target" "${flag[@]}") || return 1
        [ -n "$pid" ] && t1=$(cpu_ticks "$pid")
        if [ -n "$perf" ]; then
            kill -INT "$perf" 2>/dev/null; wait "$perf" 2>/dev/null || true
            echo "  $path $dir: where the client's CPU went (perf, by library, then the top 25 symbols):" >&2
            perf report -q -i "$WORK/perf-$path-$dir.data" --no-children --sort dso 2>/dev/null | awk 'NF && n++ < 8 { print "    " $0 }' >&2 || true
            perf report -q -i "$WORK/perf-$path-$dir.data" --no-children --sort dso,sym 2>/dev/null | awk 'NF && n++ < 25 { print "    " $0 }' >&2 || true
        fi
        read -r mbit bytes retr <<<"$out"
        if [ "$dir" = up ]; then UP[$path]=$mbit; else DOWN[$path]=$mbit; fi
        if [ -n "$pid" ]; then
            read -r secs per < <(python3 -c 'import sys
t, b, hz = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
s = t / hz
print(f"{s:.2f}", f"{s * 1000 / (b * 8 / 1e9):.0f}" if b else "-")' "$((t1 - t0))" "$bytes" "$TICK")
            if [ "$dir" = up ]; then CPU_S[$path]=$secs CPU_UP[$path]=$per; else CPU_DOWN[$path]=$per; fi
            echo "  $path $dir: $mbit Mbit/s, $retr TCP retransmits, client CPU ${secs}s, ${per} ms/Gbit" >&2
        else
            echo "  $path $dir: $mbit Mbit/s, $retr TCP retransmits" >&2
        fi
    done
}

mtu() { ip -n "$1" -o link show "$2" | sed -n 's/.* mtu \([0-9]*\).*/\1/p'; }

udp_drops() {  # UDP receive-buffer drops so far in namespace NS (/proc/net is per network namespace)
    ip netns exec "$1" awk '/^Udp:/ { if (!h) { for (i = 2; i <= NF; i++) c[$i] = i; h = 1 } else print $c["RcvbufErrors"] }' /proc/net/snmp
}
declare -A DROPS

rss() {  # "VmRSS RssAnon" of PID, in kB
    awk '/^VmRSS:/ {v = $2} /^RssAnon:/ {a = $2} END {print v, a}' "/proc/$1/status"
}

# --- a. raw ------------------------------------------------------------------------------------
echo "throughput: raw veths to 10.31.9.2, ${DURATION}s per direction" >&2
measure raw 10.31.9.2

# --- b. Roam -----------------------------------------------------------------------------------
echo "throughput: Roam to 10.77.0.1" >&2
SERVER_KEY=$("$A" keygen --out "$WORK/server.key")
CLIENT_KEY=$("$A" keygen --out "$WORK/client.key")
# start_roam CLIENT_EXTRA SERVER_EXTRA: agent serve and agent up with these lines added to their
# configurations; sets roam_server and roam_client
start_roam() {
    install -m 600 /dev/null "$WORK/server.yaml"   # users and their password hashes: root only
    cat >"$WORK/server.yaml" <<EOF
listen-port: 51820
private-key-file: $WORK/server.key
tunnel: {name: roam0, addresses: [10.77.0.1/24]}
users:
  - {name: alice, public-key: $CLIENT_KEY, addresses: [10.77.0.2]}
$2
EOF
    cat >"$WORK/client.yaml" <<EOF
server: 10.31.9.2:51820
server-key: $SERVER_KEY
private-key-file: $WORK/client.key
mode: $MODE
$([ "$MODE" = split ] && echo "routes: [10.77.0.0/24]")
lockdown: $LOCKDOWN
protocol: $PROTOCOL
$([ -n "$CIPHER" ] && echo "cipher: $CIPHER")
$1
EOF
    ip netns exec "$S" "$A" serve --config "$WORK/server.yaml" >"$WORK/serve.log" 2>&1 &
    roam_server=$!
    pids+=("$roam_server")
    wait_for 100 "roam0 in $S" ip -n "$S" link show roam0 ||
        die_with_log "agent serve did not come up" "$WORK/serve.log"
    wait_for 100 "the server's UDP port" sh -c "ip netns exec $S ss -Hlun 'sport = :51820' | grep -q 51820" ||
        die_with_log "agent serve is not listening" "$WORK/serve.log"
    ip netns exec "$L" "$A" up --config "$WORK/client.yaml" >"$WORK/up.log" 2>&1 &
    roam_client=$!
    pids+=("$roam_client")
    wait_for 150 "roam0 in $L" sh -c "ip -n $L link show roam0 && ip -n $L route get 10.77.0.1 | grep -q roam0" ||
        die_with_log "agent up did not come up" "$WORK/up.log" "$WORK/serve.log"
    wait_for 20 "a ping through Roam" ip netns exec "$L" ping -c 1 -W 1 10.77.0.1 ||
        die_with_log "no ping through Roam" "$WORK/up.log" "$WORK/serve.log"
}
start_roam "" ""
ROAM_MTU=$(mtu "$L" roam0)
sleep 3
read -r RSS_FRESH ANON_FRESH <<<"$(rss "$roam_client")"
d0s=$(udp_drops "$S") d0l=$(udp_drops "$L")
measure roam 10.77.0.1 "$roam_client"
DROPS[roam]="server ns $(($(udp_drops "$S") - d0s)), laptop ns $(($(udp_drops "$L") - d0l))"
if [ "$MODE" = full ]; then
    echo "throughput: Roam to 10.77.0.1 from a container behind a bridge on the laptop" >&2
    ip netns add "$C"
    ip -n "$C" link set lo up
    ip -n "$L" link add br-bench type bridge
    ip -n "$L" link add veth-bench type veth peer name eth0 netns "$C"
    ip -n "$L" link set veth-bench master br-bench
    ip -n "$L" address add 172.18.0.1/16 dev br-bench
    ip -n "$L" link set br-bench up
    ip -n "$L" link set veth-bench up
    ip -n "$C" address add 172.18.0.2/16 dev eth0
    ip -n "$C" link set eth0 up
    ip -n "$C" route add default via 172.18.0.1
    ip netns exec "$L" sysctl -qw net.ipv4.ip_forward=1
    ip netns exec "$L" nft -f - <<'NFT'
table ip benchnat {
    chain post { type nat hook postrouting priority srcnat; ip saddr 172.18.0.0/16 oifname != "br-bench" masquerade; }
}
NFT
    wait_for 30 "a ping from the container through Roam" ip netns exec "$C" ping -c 1 -W 1 10.77.0.1 ||
        die_with_log "no ping from the container through Roam" "$WORK/up.log"
    FROM=$C measure roam-container 10.77.0.1 "$roam_client"
fi
alive "$roam_client" || die_with_log "agent up exited" "$WORK/up.log"
alive "$roam_server" || die_with_log "agent serve exited" "$WORK/serve.log"
sleep 5
read -r RSS_IDLE ANON_IDLE <<<"$(rss "$roam_client")"
stop_pid "$roam_client"
stop_pid "$roam_server"
# A stopped agent leaves the lockdown (fail closed): the peers' own connections need it gone.
ip netns exec "$L" nft delete table inet roam 2>/dev/null || true

if [ "$TRANSPORT" = tcp ]; then
    # --- b2. Roam over its stream transport: the router drops UDP to the server ------------------
    echo "throughput: Roam over TLS on TCP 443 (UDP to the server dropped at the router)" >&2
    ip netns exec "$R" nft -f - <<'NFT'
table inet benchblock {
    chain forward { type filter hook forward priority 0; udp dport 51820 counter drop; }
}
NFT
    start_roam "tcp: 443" "tcp: 443"
    grep -q 'msg="stream opened"' "$WORK/up.log" || die_with_log "the session is not on the stream" "$WORK/up.log"
    sleep 2
    measure roam-tcp 10.77.0.1 "$roam_client"
    alive "$roam_client" || die_with_log "agent up exited" "$WORK/up.log"
    stop_pid "$roam_client"
    stop_pid "$roam_server"
    ip netns exec "$R" nft delete table inet benchblock

    # --- d. OpenVPN over TCP on the same path ----------------------------------------------------
    echo "throughput: OpenVPN over TCP to 10.99.0.1" >&2
    # A stopped agent leaves the lockdown (fail closed): OpenVPN's own connection needs it gone.
    ip netns exec "$L" nft delete table inet roam 2>/dev/null || true
    (
        cd "$WORK" && umask 077
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench-ca \
            -keyout ca.key -out ca.crt 2>/dev/null
        for who in ovpn-server ovpn-client; do
            openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$who" \
                -keyout "$who.key" -out "$who.csr" 2>/dev/null
            printf 'extendedKeyUsage=%s\n' "$([ $who = ovpn-server ] && echo serverAuth || echo clientAuth)" >"$who.ext"
            openssl x509 -req -in "$who.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$who.ext" \
                -out "$who.crt" 2>/dev/null
        done
    )
    ovpn_common=(--dev-type tun --cipher AES-256-GCM --data-ciphers AES-256-GCM --ca "$WORK/ca.crt" --verb 1)
    ip netns exec "$S" openvpn "${ovpn_common[@]}" --dev ovpns --mode server --tls-server --dh none --port 1194 \
        --proto tcp-server --cert "$WORK/ovpn-server.crt" --key "$WORK/ovpn-server.key" --topology subnet \
        --ifconfig 10.99.0.1 255.255.255.0 --ifconfig-pool 10.99.0.2 10.99.0.9 --push "topology subnet" \
        >"$WORK/ovpn-server.log" 2>&1 &
    ovpn_server=$!
    pids+=("$ovpn_server")
    wait_for 100 "OpenVPN's TCP port" sh -c "ip netns exec $S ss -Hltn 'sport = :1194' | grep -q 1194" ||
        die_with_log "openvpn (server) did not come up" "$WORK/ovpn-server.log"
    ip netns exec "$L" openvpn "${ovpn_common[@]}" --dev ovpnl --client --remote 10.31.9.2 1194 --proto tcp-client \
        --cert "$WORK/ovpn-client.crt" --key "$WORK/ovpn-client.key" --route-nopull >"$WORK/ovpn-client.log" 2>&1 &
    ovpn_client=$!
    pids+=("$ovpn_client")
    wait_for 300 "a ping through OpenVPN" ip netns exec "$L" ping -c 1 -W 1 10.99.0.1 ||
        die_with_log "no ping through OpenVPN" "$WORK/ovpn-client.log" "$WORK/ovpn-server.log"
    measure openvpn-tcp 10.99.0.1 "$ovpn_client"
    stop_pid "$ovpn_client"
    stop_pid "$ovpn_server"
fi

# --- c. wireguard-go ---------------------------------------------------------------------------
echo "throughput: wireguard-go to 10.88.0.1" >&2
(umask 077 && wg genkey >"$WORK/wg-server.key" && wg genkey >"$WORK/wg-laptop.key")
chmod 600 "$WORK/wg-server.key" "$WORK/wg-laptop.key"
WG_SERVER_PUB=$(wg pubkey <"$WORK/wg-server.key")
WG_LAPTOP_PUB=$(wg pubkey <"$WORK/wg-laptop.key")
ip netns exec "$S" wireguard-go -f "$WGS" >"$WORK/wg-server.log" 2>&1 &
wg_server=$!
pids+=("$wg_server")
ip netns exec "$L" wireguard-go -f "$WGL" >"$WORK/wg-laptop.log" 2>&1 &
wg_client=$!
pids+=("$wg_client")
wait_for 100 "$WGS in $S" sh -c "ip -n $S link show $WGS && test -S /run/wireguard/$WGS.sock" ||
    die_with_log "wireguard-go (server) did not come up" "$WORK/wg-server.log"
wait_for 100 "$WGL in $L" sh -c "ip -n $L link show $WGL && test -S /run/wireguard/$WGL.sock" ||
    die_with_log "wireguard-go (laptop) did not come up" "$WORK/wg-laptop.log"
ip netns exec "$S" wg set "$WGS" listen-port 51821 private-key "$WORK/wg-server.key" \
    peer "$WG_LAPTOP_PUB" allowed-ips 10.88.0.2/32
ip -n "$S" address add 10.88.0.1/24 dev "$WGS"
ip -n "$S" link set "$WGS" up
ip netns exec "$L" wg set "$WGL" private-key "$WORK/wg-laptop.key" \
    peer "$WG_SERVER_PUB" endpoint 10.31.9.2:51821 allowed-ips 10.88.0.0/24
ip -n "$L" address add 10.88.0.2/24 dev "$WGL"
ip -n "$L" link set "$WGL" up
wait_for 20 "a ping through wireguard-go" ip netns exec "$L" ping -c 1 -W 1 10.88.0.1 ||
    die_with_log "no ping through wireguard-go" "$WORK/wg-laptop.log" "$WORK/wg-server.log"
WG_MTU=$(mtu "$L" "$WGL")
d0s=$(udp_drops "$S") d0l=$(udp_drops "$L")
measure wireguard-go 10.88.0.1 "$wg_client"
DROPS[wireguard-go]="server ns $(($(udp_drops "$S") - d0s)), laptop ns $(($(udp_drops "$L") - d0l))"
stop_pid "$wg_client"
stop_pid "$wg_server"

# --- report ------------------------------------------------------------------------------------
ratio() { python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f"{a / b:.2f}" if b else "-")' "$1" "$2"; }
echo
SPOKEN=$(grep -o 'msg="handshake completed".*' "$WORK/up.log" | head -n 1 | grep -o 'protocol=[0-9]* cipher=[a-z0-9-]*\|cipher=[a-z0-9-]* protocol=[0-9]*' || echo "unknown")
echo "iperf3, 1 TCP stream, ${DURATION}s per direction, laptop ns -> server ns ($(nproc) cores); Roam in $MODE mode, lockdown $LOCKDOWN, session: $SPOKEN; random loss at the router: $LOSS% each way"
printf '%-14s %10s %12s %15s %22s %24s\n' path "up Mbit/s" "down Mbit/s" "client CPU s" "client CPU ms/Gbit up" "client CPU ms/Gbit down"
for p in raw roam $([ "$MODE" = full ] && echo roam-container) $([ "$TRANSPORT" = tcp ] && echo roam-tcp openvpn-tcp) wireguard-go; do
    printf '%-14s %10s %12s %15s %22s %24s\n' "$p" "${UP[$p]}" "${DOWN[$p]}" "${CPU_S[$p]:--}" "${CPU_UP[$p]:--}" "${CPU_DOWN[$p]:--}"
done
printf '%-14s %10s %12s %15s %22s %24s\n' "roam/wg-go" "$(ratio "${UP[roam]}" "${UP[wireguard-go]}")" \
    "$(ratio "${DOWN[roam]}" "${DOWN[wireguard-go]}")" "" \
    "$(ratio "${CPU_UP[roam]}" "${CPU_UP[wireguard-go]}")" "$(ratio "${CPU_DOWN[roam]}" "${CPU_DOWN[wireguard-go]}")"
printf '%-14s %10s %12s\n' "roam/raw" "$(ratio "${UP[roam]}" "${UP[raw]}")" "$(ratio "${DOWN[roam]}" "${DOWN[raw]}")"
if [ "$TRANSPORT" = tcp ]; then
    printf '%-14s %10s %12s\n' "roam-tcp/roam" "$(ratio "${UP[roam-tcp]}" "${UP[roam]}")" "$(ratio "${DOWN[roam-tcp]}" "${DOWN[roam]}")"
    printf '%-14s %10s %12s\n' "roam-tcp/ovpn" "$(ratio "${UP[roam-tcp]}" "${UP[openvpn-tcp]}")" "$(ratio "${DOWN[roam-tcp]}" "${DOWN[openvpn-tcp]}")"
fi
echo "client CPU s: the client process's utime+stime during the upload run; MTU: roam0 $ROAM_MTU, wireguard-go $WG_MTU"
echo "Roam client RSS: ${RSS_FRESH} kB (RssAnon ${ANON_FRESH} kB) idle after up; ${RSS_IDLE} kB (RssAnon ${ANON_IDLE} kB) idle 5 s after the runs"
echo "UDP RcvbufErrors during the runs: roam: ${DROPS[roam]}; wireguard-go: ${DROPS[wireguard-go]}"
echo "wall time: $(($(date +%s) - started)) s (after the build)"
for f in serve up; do  # the agents log at level info; show what they said
    n=$(wc -l <"$WORK/$f.log")
    echo "agent $f log ($n lines$([ "$n" -gt 12 ] && echo ", first 6 and last 6")):"
    if [ "$n" -gt 12 ]; then { head -n 6; echo "  ..."; tail -n 6; } <"$WORK/$f.log"; else cat "$WORK/$f.log"; fi | sed 's/^/  /'
done
