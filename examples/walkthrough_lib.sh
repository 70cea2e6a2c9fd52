# Sourced by the walkthroughs (cluster_walkthrough.sh, replication_walkthrough.sh): the demo
# directory, stopping what was started, printing commands, bounded waits, starting brokers.
# Expects DEMO_DIR to be set; sets ZK, PY and URL (the registry's zk:// URL).

ZK=${ZK:-127.0.0.1:2181}
PY=${PYTHON:-python3}
URL="zk://$ZK/meta"

rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR"
cd "$DEMO_DIR"

cleanup() { # stop every background job (brokers, consumers): SIGTERM, then wait for them
    local pids
    pids=$(jobs -p)
    if [ -n "$pids" ]; then
        kill $pids 2>/dev/null || true
        wait 2>/dev/null || true
    fi
}
trap cleanup EXIT

show() { # print a command as a reader would type it, then run it
    printf '+ %s\n' "$1"
    eval "$1"
}

wait_until() { # wait_until <seconds> <what> <command...>: poll a condition, bounded
    local deadline=$((SECONDS + $1)) what=$2
    shift 2
    until "$@" >/dev/null 2>&1; do
        if ((SECONDS >= deadline)); then
            echo "gave up waiting: $what" >&2
            exit 1
        fi
        sleep 0.2
    done
}

start() { # start <dir> [server options...]: a broker in the background, logging to server.log
    local dir=$1
    shift
    (cd "$dir" && exec pymetaq server -f server.ini "$@" >server.log 2>&1) &
    echo $! >"$dir/pid"
    wait_until 60 "$dir listening" grep -q 'listening on' "$dir/server.log"
}
