#!/usr/bin/env bash
# Several "hosts" on one Linux machine: network namespaces host0, host1, ..., each with its
# own interface (eth0), address (10.213.0.1, 10.213.0.2, ...) and host name, joined by a
# bridge, as machines on one switch. Multi-node loom jobs run across them over real TCP:
# the store, Gloo's connections, a lost host, a cut link. Needs root (ip netns).
#
#   scripts/two_hosts.sh 'build/parallel/loomrun --nnodes 2 --node_rank $HOST_RANK ...'
#       creates 2 hosts, runs the command line in each at once (as `ssh hostI 'command'`
#       would), with HOST_RANK (0, 1, ...), HOST_ADDR (its address) and HOSTS (how many)
#       set; each output line is prefixed "[hostI] "; waits for all, removes everything.
#       Exits with the first non-zero status among the hosts, or 0.
#   scripts/two_hosts.sh --hosts 3 '...'          three hosts
#   scripts/two_hosts.sh --hold [--name NAME]     creates the hosts, prints one line
#       "hosts NAME ADDR0 ADDR1 ...", then waits until its standard input ends (a test's
#       pipe closing, Ctrl-D) and removes them. Meanwhile, from anywhere:
#   scripts/two_hosts.sh --name NAME on I 'command'      runs a command line in host I
#   scripts/two_hosts.sh --name NAME link I down|up      unplugs / replugs host I's cable
#   scripts/two_hosts.sh --name NAME kill I              SIGKILLs every process of host I
#   scripts/two_hosts.sh check                           exit 0 if this machine can make
#                                                        namespaces, else says why (exit 1)
#
# Inside host I, the host name is hostI and /etc/hosts names every host (ip netns exec
# mounts /etc/netns/<namespace>/hosts over it), so `--master_addr host0` resolves as on
# a cluster; loom's gloo backend sees different host names, so it uses TCP between hosts
# rather than shared memory (which namespaces would otherwise share).
#
# Isolation: the bridge lives in a namespace of its own (NAME-sw) with no link to the
# machine's own network, and no host has a route out, so traffic stays between these
# namespaces; 10.213.0.0/24 exists only inside them. Cleanup: a trap on exit, Ctrl-C and
# termination kills every process left in the hosts, deletes the namespaces (their
# interfaces go with them) and /etc/netns/NAME-*. A run killed with SIGKILL cannot trap;
# the next run of this script removes namespaces whose creating process is gone.
set -euo pipefail

readonly SUBNET=10.213.0
hosts=2
name=""
hold=false

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "two_hosts.sh: $*" >&2; exit 1; }
ns_of() { echo "$name-h$1"; }
address_of() { echo "$SUBNET.$(($1 + 1))"; }

# Namespaces need root and a kernel that allows them; say which step failed.
check_namespaces() {
  command -v ip >/dev/null || die "the 'ip' command (iproute2) is not installed"
  [ "$(id -u)" = 0 ] || die "network namespaces need root (ip netns add); this is uid $(id -u)"
  local probe="loomprobe$$"
  local error
  error=$(ip netns add "$probe" 2>&1) || die "'ip netns add' failed here: $error"
  error=$(ip -n "$probe" link add veth0 type veth peer name veth1 2>&1) ||
    { ip netns del "$probe"; die "'ip link add ... type veth' failed in a namespace: $error"; }
  ip netns del "$probe"
}

# Namespaces left by a run of this script that was killed with SIGKILL (name loomh<pid>).
remove_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^loomh[0-9]+-(sw|h[0-9]+)$' || true); do
    pid=${ns#loomh}
    pid=${pid%%-*}
    if ! kill -0 "$pid" 2>/dev/null; then
      for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
      rm -rf "/etc/netns/$ns"
    fi
  done
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM HUP
  local i ns
  [ -z "${reader:-}" ] || kill "$reader" 2>/dev/null || true
  for ((i = 0; i < hosts; ++i)); do
    ns=$(ns_of "$i")
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  done
  for ((i = 0; i < hosts; ++i)); do
    ns=$(ns_of "$i")
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  ip netns del "$name-sw" 2>/dev/null || true
  rmdir /etc/netns 2>/dev/null || true  # only if no one else's files are left in it
  wait 2>/dev/null || true
  exit "$status"
}

create_hosts() {
  local taken
  taken=$(ip netns list | awk '{print $1}' | grep -E "^$name-(sw|h[0-9]+)\$" || true)
  [ -z "$taken" ] || die "namespaces named '$name' exist already ($(echo $taken)); pick another --name"
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  local sw="$name-sw" i ns hosts_file=""
  for ((i = 0; i < hosts; ++i)); do hosts_file+="$(address_of "$i") host$i"$'\n'; done
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < hosts; ++i)); do
    ns=$(ns_of "$i")
    ip netns add "$ns"
    # The cable: eth0 in the host, port$i on the switch.
    ip -n "$sw" link add "port$i" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "port$i" master br0
    ip -n "$sw" link set "port$i" up
    ip -n "$ns" addr add "$(address_of "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    mkdir -p "/etc/netns/$ns"
    printf '127.0.0.1 localhost\n::1 localhost\n%s' "$hosts_file" >"/etc/netns/$ns/hosts"
  done
}

# Runs a command line in host $1, with its host name, as `ssh hostI 'command'` would.
run_on() {
  local i=$1
  shift
  [[ "$i" =~ ^[0-9]+$ ]] || die "expected a host number, got '$i'"
  local ns
  ns=$(ns_of "$i")
  ip netns pids "$ns" >/dev/null 2>&1 || die "no host $i in '$name' (ip netns list shows what exists)"
  exec ip netns exec "$ns" unshare --uts env HOST_RANK="$i" HOST_ADDR="$(address_of "$i")" \
    sh -c 'hostname "host$HOST_RANK" && exec sh -c "$0"' "$*"
}

while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) [[ "${2:-}" =~ ^[1-9][0-9]*$ ]] && [ "$2" -le 200 ] || die "--hosts expects 1 ... 200, got '${2:-}'"
             hosts=$2; shift 2 ;;
    --name) [[ "${2:-}" =~ ^[a-zA-Z0-9]+$ ]] || die "--name expects letters and digits, got '${2:-}'"
            name=$2; shift 2 ;;
    --hold) hold=true; shift ;;
    -h|--help) usage ;;
    --) shift; break ;;
    *) break ;;
  esac
done

case "${1:-}" in
  check) check_namespaces; echo "two_hosts.sh: network namespaces work here"; exit 0 ;;
  on|link|kill)
    [ -n "$name" ] || die "$1: give the hosts' --name (printed by --hold)"
    command=$1 i=${2:-}
    [[ "$i" =~ ^[0-9]+$ ]] || die "$command: expected a host number, got '$i'"
    case "$command" in
      on) shift 2; run_on "$i" "$@" ;;
      link) [[ "${3:-}" =~ ^(up|down)$ ]] || die "link: expected up or down, got '${3:-}'"
            exec ip -n "$name-sw" link set "port$i" "$3" ;;
      kill) for p in $(ip netns pids "$(ns_of "$i")"); do kill -9 "$p" 2>/dev/null || true; done; exit 0 ;;
    esac ;;
esac

check_namespaces
remove_stale
[ -n "$name" ] || name="loomh$$"
create_hosts

if $hold; then
  echo "hosts $name$(for ((i = 0; i < hosts; ++i)); do printf ' %s' "$(address_of "$i")"; done)"
  # Until standard input ends; `wait` (unlike a command in the foreground) lets the traps
  # run at once on a signal. A background command reads /dev/null unless told otherwise.
  cat <&0 >/dev/null &
  reader=$!
  wait "$reader" || true
  exit 0
fi

[ $# -gt 0 ] || usage
pids=()
for ((i = 0; i < hosts; ++i)); do
  (
    set -o pipefail
    HOSTS=$hosts "$0" --name "$name" on "$i" "$@" 2>&1 | sed -u "s/^/[host$i] /"
  ) &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
  wait "$pid" || { code=$?; [ "$status" != 0 ] || status=$code; }
done
exit "$status"
