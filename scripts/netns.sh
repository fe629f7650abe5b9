#!/usr/bin/env bash
# A two-node test cluster on one machine, in network namespaces, for multi-node runs of
# stallscope and of the example trainers (gloo over TCP) with a network of known speed.
#
#   netns.sh up PREFIX [RATE] [--net N] [--collector]
#       Namespaces PREFIXa and PREFIXb, each with lo and an eth0 at 10.77.N.1/24 and
#       10.77.N.2/24, joined by one veth pair. With --collector, a third node PREFIXc at
#       10.77.N.3 and a switch namespace PREFIXsw whose bridge joins the three. With RATE,
#       shapes as `shape` does. An existing cluster of that PREFIX is taken down first.
#       Prints one line per node on stdout: NAMESPACE ADDRESS.
#   netns.sh shape PREFIX RATE|off
#       Token-bucket shaping of every node's eth0 egress (so both directions of a pair):
#       tc qdisc replace dev eth0 root tbf rate RATE burst 64kb latency 50ms.
#       RATE in tc's units: 50mbit, 1gbit. `off` removes it. (No netem here: no delay/loss.)
#   netns.sh down PREFIX
#       Deletes the cluster's namespaces (and with them the veths). Never fails; a cluster
#       already gone is fine.
#   netns.sh status PREFIX
#       Shows the nodes, their addresses and qdiscs.
#
# N (the third octet) comes from --net, else $STALLSCOPE_NETNS_NET, else a hash of PREFIX, so
# parallel runs with different prefixes get different subnets. Run inside a node with
# `ip netns exec PREFIXa CMD`. Needs root (or CAP_NET_ADMIN and CAP_SYS_ADMIN).
set -euo pipefail

NODES=(a b)

die() {
    echo "netns: $*" >&2
    exit 1
}
say() { echo "netns: $*" >&2; }

usage() {
    sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

check_prefix() {
    [[ "$1" =~ ^[A-Za-z][A-Za-z0-9_-]{0,30}$ ]] ||
        die "PREFIX must be 1-31 characters of [A-Za-z0-9_-], starting with a letter: '$1'"
}

ns_exists() { [[ -e "/run/netns/$1" ]]; }

# Namespaces of the cluster PREFIX that exist now.
cluster_namespaces() {
    local n
    for n in a b c sw; do
        if ns_exists "$1$n"; then echo "$1$n"; fi
    done
}

node_namespaces() {
    local n
    for n in a b c; do
        if ns_exists "$1$n"; then echo "$1$n"; fi
    done
}

subnet_for() {
    local prefix=$1 net=${2:-${STALLSCOPE_NETNS_NET:-}}
    if [[ -z "$net" ]]; then
        net=$(($(printf '%s' "$prefix" | cksum | cut -d' ' -f1) % 254 + 1))
    fi
    [[ "$net" =~ ^[0-9]+$ ]] && ((10#$net <= 255)) ||
        die "--net must be 0-255, got '$net'"
    echo "$net"
}

cmd_down() {
    local prefix=$1 ns pids
    check_prefix "$prefix"
    local gone=()
    for ns in $(cluster_namespaces "$prefix"); do
        pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ' || true)
        if [[ -n "${pids// /}" ]]; then
            say "warning: processes still run in $ns (pids: $pids); its network lives on until they exit"
        fi
        ip netns del "$ns" 2>/dev/null || true
        gone+=("$ns")
    done
    if [[ ${#gone[@]} -eq 0 ]]; then
        say "down: nothing named ${prefix}{a,b,c,sw}"
    else
        say "down: deleted ${gone[*]}"
    fi
    return 0
}

cmd_shape() {
    local prefix=$1 rate=$2 ns
    check_prefix "$prefix"
    local nodes
    nodes=$(node_namespaces "$prefix")
    [[ -n "$nodes" ]] || die "shape: no cluster named $prefix (run: netns.sh up $prefix)"
    for ns in $nodes; do
        if [[ "$rate" == off ]]; then
            ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
        else
            ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst 64kb latency 50ms ||
                die "shape: tc refused rate '$rate' on $ns"
        fi
    done
    say "shape: eth0 egress of $(echo $nodes) is ${rate/off/unshaped}"
}

cmd_status() {
    local prefix=$1 ns
    check_prefix "$prefix"
    for ns in $(node_namespaces "$prefix"); do
        echo "$ns: $(ip -n "$ns" -4 -o addr show dev eth0 | awk '{print $4}')" \
            "qdisc: $(ip netns exec "$ns" tc qdisc show dev eth0 root | head -1)"
    done
}

cmd_up() {
    local prefix=$1 rate=$2 net=$3 collector=$4
    check_prefix "$prefix"
    [[ $(id -u) -eq 0 ]] || die "up needs root"
    net=$(subnet_for "$prefix" "$net")
    if [[ -n "$(cluster_namespaces "$prefix")" ]]; then
        say "up: a cluster named $prefix exists; taking it down first"
        cmd_down "$prefix"
    fi
    local nodes=("${NODES[@]}")
    [[ $collector -eq 1 ]] && nodes+=(c)

    # Any failure from here on leaves nothing behind.
    trap 'say "up failed; cleaning up"; cmd_down "$prefix" >/dev/null 2>&1' ERR

    local n i
    for n in "${nodes[@]}"; do
        ip netns add "$prefix$n"
        ip -n "$prefix$n" link set lo up
    done
    if [[ $collector -eq 0 ]]; then
        ip link add eth0 netns "${prefix}a" type veth peer name eth0 netns "${prefix}b"
    else
        ip netns add "${prefix}sw"
        ip -n "${prefix}sw" link set lo up
        ip -n "${prefix}sw" link add br0 type bridge
        ip -n "${prefix}sw" link set br0 up
        for n in "${nodes[@]}"; do
            ip link add eth0 netns "$prefix$n" type veth peer name "port-$n" netns "${prefix}sw"
            ip -n "${prefix}sw" link set "port-$n" master br0
            ip -n "${prefix}sw" link set "port-$n" up
        done
    fi
    i=1
    for n in "${nodes[@]}"; do
        ip -n "$prefix$n" addr add "10.77.$net.$i/24" dev eth0
        ip -n "$prefix$n" link set eth0 up
        i=$((i + 1))
    done
    trap - ERR

    if [[ -n "$rate" ]] && ! (cmd_shape "$prefix" "$rate"); then
        cmd_down "$prefix"
        exit 1
    fi
    say "up: ${#nodes[@]} nodes on 10.77.$net.0/24; run in one with: ip netns exec ${prefix}a CMD"
    i=1
    for n in "${nodes[@]}"; do
        echo "$prefix$n 10.77.$net.$i"
        i=$((i + 1))
    done
}

main() {
    [[ $# -ge 1 ]] || usage
    local cmd=$1
    shift
    local args=() net="" collector=0
    while [[ $# -gt 0 ]]; do
        case "$1" in
            --net)
                [[ $# -ge 2 ]] || die "--net needs a value"
                net=$2
                shift 2
                ;;
            --net=*)
                net=${1#--net=}
                shift
                ;;
            --collector)
                collector=1
                shift
                ;;
            -h | --help) usage ;;
            -*) die "unknown option $1" ;;
            *)
                args+=("$1")
                shift
                ;;
        esac
    done
    case "$cmd" in
        up)
            [[ ${#args[@]} -ge 1 && ${#args[@]} -le 2 ]] || usage
            cmd_up "${args[0]}" "${args[1]:-}" "$net" "$collector"
            ;;
        shape)
            [[ ${#args[@]} -eq 2 ]] || usage
            cmd_shape "${args[0]}" "${args[1]}"
            ;;
        down)
            [[ ${#args[@]} -eq 1 ]] || usage
            cmd_down "${args[0]}"
            ;;
        status)
            [[ ${#args[@]} -eq 1 ]] || usage
            cmd_status "${args[0]}"
            ;;
        -h | --help | help) usage ;;
        *) die "unknown command '$cmd' (up, shape, down, status)" ;;
    esac
}

main "$@"
