#!/usr/bin/env bash
# Three brokers on one machine, registered in ZooKeeper; a producer and a consumer group of two
# through the registry; one broker killed with kill -9 and brought back.  Every command it runs
# is printed with "+ " before its output (as bash's set -x does); docs/cluster.md shows a run
# and tests/cluster/test_docs.py runs it.
#
#   ZK=127.0.0.1:2181 PORTS="18200 18201 18202" bash examples/cluster_walkthrough.sh
#
# ZK: a running ZooKeeper (host:port, optionally with a chroot); PORTS: three free ports;
# DEMO_DIR: where the brokers' directories go (default ./cluster-demo, created afresh).
# Everything it starts is stopped when it exits, also on Ctrl-C.
set -euo pipefail

read -r -a PORT <<<"${PORTS:-18200 18201 18202}"
DEMO_DIR=${DEMO_DIR:-cluster-demo}
# shellcheck source=examples/walkthrough_lib.sh
source "$(dirname "$0")/walkthrough_lib.sh"

group_settled() { # group billing has <members> members and every live partition has lag 0
    pymetaq cluster --servers "$URL" --group billing --json | "$PY" -c '
import json, sys
want = int(sys.argv[1])
(g,) = [g for g in json.load(sys.stdin)["groups"] if g["group"] == "billing"]
parts = [p for p in g["partitions"] if p["end"] is not None]
ok = len(g["members"]) == want and parts and all(p["owner"] and p["lag"] == 0 for p in parts)
sys.exit(0 if ok else 1)' "$1"
}

publishing() { # publishing <ids>: exactly these brokers publish orders
    pymetaq cluster --servers "$URL" --json | "$PY" -c '
import json, sys
(t,) = [t for t in json.load(sys.stdin)["topics"] if t["topic"] == "orders"]
sys.exit(0 if sorted(t["publish"]) == sys.argv[1].split() else 1)' "$1"
}

for i in 0 1 2; do
    mkdir "b$i"
    cat >"b$i/server.ini" <<EOF
[system]
brokerId=$i
hostName=127.0.0.1
serverPort=${PORT[$i]}
dataPath=data
unflushThreshold=0
dashboardHttpPort=0

[zookeeper]
zk.zkEnable=true
zk.zkConnect=$ZK
zk.zkSessionTimeoutMs=6000
zk.zkSyncTimeMs=1000

[topic=orders]
numPartitions=2
EOF
done

show "cat b1/server.ini"
printf '+ %s\n' "(cd b0 && pymetaq server -f server.ini > server.log 2>&1 &)    # b1, b2 the same"
for i in 0 1 2; do start "b$i"; done
show "cat b0/server.log"
show "pymetaq cluster --servers $URL"

echo
echo "# a producer, then a group of two consumers"
show "seq 1 12 | sed 's/^/order-/' | pymetaq produce --server $URL --topic orders --batch 1"
show "pymetaq consume --server $URL --topic orders --group billing > a.out 2> a.err &"
wait_until 60 "the first consumer caught up" group_settled 1
show "pymetaq consume --server $URL --topic orders --group billing > b.out 2> b.err &"
wait_until 60 "the group settled with two members" group_settled 2
show "pymetaq cluster --servers $URL --group billing"

echo
echo "# broker 1 dies"
# bash reports a job killed by a signal ("line N: PID Killed ...") on its own stderr at a
# command boundary of its choosing, which a redirection of `wait` alone does not always cover
# (about 1 run in 70): the shell's stderr goes nowhere until the broker has been reaped
exec 3>&2 2>/dev/null
show 'kill -9 $(cat b1/pid)'
wait "$(cat b1/pid)" || true
true
exec 2>&3 3>&-
show "seq 13 18 | sed 's/^/order-/' | pymetaq produce --server $URL --topic orders --batch 1"
wait_until 60 "broker 1's session expired" publishing "0 2"
wait_until 60 "the group consumed the six" group_settled 2
show "pymetaq cluster --servers $URL --group billing"

echo
echo "# it comes back"
printf '+ %s\n' "(cd b1 && pymetaq server -f server.ini > server.log 2>&1 &)"
start b1
wait_until 60 "broker 1 registered orders" publishing "0 1 2"
show "seq 19 24 | sed 's/^/order-/' | pymetaq produce --server $URL --topic orders --batch 1"
wait_until 60 "the group consumed all 24" group_settled 2
show "pymetaq cluster --servers $URL --group billing"
show "cat a.out b.out | sort -t- -k2 -n | tr '\n' ' '; echo"
show "pymetaq offsets show --store $URL --group billing --server $URL"
