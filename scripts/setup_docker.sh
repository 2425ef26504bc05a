#!/usr/bin/env bash
# A Docker engine for the opt-in compose test (and for trying docker-compose.yml by hand) on a
# machine without systemd or a reachable container registry (see shared NOTES: Containers).
#
#   scripts/setup_docker.sh          install docker.io, docker-compose, debootstrap, eatmydata if missing, start
#                                    dockerd unless one already answers (~40 s on a clean machine)
#   scripts/setup_docker.sh --stop   stop the dockerd this script started (nothing else), and remove the
#                                    iptables rules, chains and docker0 bridge that dockerd added
#
# The daemon it starts is recorded in $FARM_DOCKERD_PIDFILE (default /run/rollout-farm-dockerd.pid):
# --stop touches a daemon only through that file, so a Docker engine someone else runs is left alone.
# The host's iptables as they were before that start are saved next to it (<pidfile>.iptables):
# --stop removes only what appeared since and belongs to Docker (chains created since, and new rules
# in them, jumping to them or naming docker0/br-*), and puts changed policies back. It never
# flushes a table: the machine's own firewall and NAT rules stay as they are.
# Root only (apt, dockerd).
set -euo pipefail

pidfile="${FARM_DOCKERD_PIDFILE:-/run/rollout-farm-dockerd.pid}"
statefile="${pidfile}.iptables"
bridgefile="${pidfile}.docker0"
logfile="${FARM_DOCKERD_LOG:-/var/log/rollout-farm-dockerd.log}"
# Debian's client: the /usr/local/bin/docker some images carry cannot talk BuildKit to the 20.10 daemon.
docker=/usr/bin/docker

answers() { "$docker" info >/dev/null 2>&1; }

stop() {
    [[ -f "$pidfile" ]] || { echo "no dockerd started by this script ($pidfile absent)"; return 0; }
    local pid
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
        # containerd, started by dockerd as its child, goes with it; wait so its socket is free.
        for _ in $(seq 1 50); do pgrep -P "$pid" >/dev/null 2>&1 || break; sleep 0.1; done
    fi
    rm -f "$pidfile"
    # A stopped dockerd leaves its NAT rules and bridge behind (NOTES): a later start, or another
    # engine, would find stale chains. Only what it added goes; the rest of the firewall stays.
    undo_iptables
    if [[ -f "$bridgefile" ]]; then
        ip link show docker0 >/dev/null 2>&1 && ip link del docker0 || true
        rm -f "$bridgefile"
    fi
    echo "dockerd $pid stopped, its iptables rules and docker0 removed"
}

# The iptables commands that undo what appeared since $statefile was saved and belongs to Docker.
undo_commands() {
    python3 - "$statefile" <<'PY'
import re, shlex, subprocess, sys

def parse(text):
    tables, table = {}, None
    for line in text.splitlines():
        if line.startswith("*"):
            table = tables.setdefault(line[1:], {"chains": {}, "rules": []})
        elif line.startswith(":") and table is not None:
            name, policy = line[1:].split()[:2]
            table["chains"][name] = policy
        elif line.startswith("-A ") and table is not None:
            table["rules"].append(line[3:])
    return tables

before = parse(open(sys.argv[1]).read())
after = parse(subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout)
iface = re.compile(r"(^|\s)(docker0|br-[0-9a-f]{12})(\s|$)")
for name, now in after.items():
    was = before.get(name, {"chains": {}, "rules": []})
    new_chains = set(now["chains"]) - set(was["chains"])
    old_rules = set(was["rules"])
    for rule in reversed(now["rules"]):
        words = shlex.split(rule)
        target = words[words.index("-j") + 1] if "-j" in words else None
        ours = words[0] in new_chains or target in new_chains or iface.search(rule)
        if rule not in old_rules and ours:
            print(shlex.join(["iptables", "-t", name, "-D", *words]))
    for chain in sorted(new_chains):
        print(shlex.join(["iptables", "-t", name, "-F", chain]))
    for chain in sorted(new_chains):
        print(shlex.join(["iptables", "-t", name, "-X", chain]))
    for chain, policy in now["chains"].items():
        if policy != "-" and was["chains"].get(chain, policy) != policy:
            print(shlex.join(["iptables", "-t", name, "-P", chain, was["chains"][chain]]))
PY
}

undo_iptables() {
    [[ -f "$statefile" ]] || { echo "no iptables state saved at start ($statefile): iptables left as they are"; return 0; }
    if command -v iptables-save >/dev/null; then
        local cmd
        while IFS= read -r cmd; do
            eval "$cmd" || echo "could not undo: $cmd" >&2
        done < <(undo_commands)
    fi
    rm -f "$statefile"
}

install() {
    local missing=()
    [[ -x /usr/sbin/dockerd && -x "$docker" ]] || missing+=(docker.io)
    command -v docker-compose >/dev/null || missing+=(docker-compose)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    # scripts/build_base_image.sh runs debootstrap under it (no fsyncs: a third faster).
    command -v eatmydata >/dev/null || missing+=(eatmydata)
    if ((${#missing[@]})); then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

start() {
    if answers; then
        echo "a Docker engine already answers: using it"
        return 0
    fi
    # No systemd here: dockerd runs as a plain background process, in a session of its own so the
    # caller's Ctrl-C or process group kill does not take it down halfway.
    # What the host's firewall and links were before: --stop removes only what dockerd adds to them.
    if command -v iptables-save >/dev/null; then iptables-save >"$statefile"; fi
    if ip link show docker0 >/dev/null 2>&1; then rm -f "$bridgefile"; else touch "$bridgefile"; fi
    setsid /usr/sbin/dockerd --storage-driver=overlay2 >"$logfile" 2>&1 </dev/null &
    echo $! >"$pidfile"
    for _ in $(seq 1 300); do
        if answers; then
            echo "dockerd started (pid $(cat "$pidfile"), log $logfile)"
            return 0
        fi
        kill -0 "$(cat "$pidfile")" 2>/dev/null || break
        sleep 0.1
    done
    echo "dockerd did not come up; its log ($logfile):" >&2
    tail -n 30 "$logfile" >&2
    stop >&2
    return 1
}

case "${1:-}" in
    --stop) stop ;;
    "") install; start ;;
    *) echo "usage: $0 [--stop]" >&2; exit 2 ;;
esac
