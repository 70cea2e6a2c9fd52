#!/usr/bin/env bash
# Replication on one machine: a master with an asynchronous slave (MetaQ's metaslave) registered
# in ZooKeeper, then a synchronous pair (samsa master, gregor slave).  Every command it runs is
# printed with "+ " before its output (as bash's set -x does); docs/replication.md shows a run
# and tests/ha/test_docs.py runs it.
#
#   ZK=127.0.0.1:2181 PORTS="18300 18301 18302 18303" bash examples/replication_walkthrough.sh
#
# ZK: a running ZooKeeper (host:port, optionally with a chroot); PORTS: four free ports (the
# master, its async slave, the gregor slave, the samsa master); DEMO_DIR: where the brokers'
# directories go (default ./replication-demo, created afresh).  Everything it starts is
# stopped when it exits, also on Ctrl-C.
set -euo pipefail

read -r -a PORT <<<"${PORTS:-18300 18301 18302 18303}"
DEMO_DIR=${DEMO_DIR:-replication-demo}
# shellcheck source=examples/walkthrough_lib.sh
source "$(dirname "$0")/walkthrough_lib.sh"

caught_up() { # caught_up <port>: the slave there holds all the master has, every partition
    pymetaq stats replication --server "meta://127.0.0.1:$1" | "$PY" -c '
import sys
rows = [ln.split() for ln in sys.stdin.read().splitlines()[1:]]
ok = rows and all(r[r.index("lag_bytes") + 1] == "0" for r in rows)
sys.exit(0 if ok else 1)'
}

write_ini() { # write_ini <dir> <brokerId> <port> <zkEnable>
    mkdir -p "$1"
    cat >"$1/server.ini" <<EOF
[system]
brokerId=$2
hostName=127.0.0.1
serverPort=$3
dataPath=data
unflushThreshold=0
dashboardHttpPort=0

[zookeeper]
zk.zkEnable=$4
zk.zkConnect=$ZK
zk.zkSessionTimeoutMs=6000
zk.zkSyncTimeMs=100

[topic=orders]
numPartitions=2
EOF
}

echo "# an asynchronous slave"
write_ini master 0 "${PORT[0]}" true
write_ini slave 0 "${PORT[1]}" true
printf 'slaveId=1\nslaveMaxDelayInMills=500\n' >slave/async_slave.properties
start master
show "cat slave/async_slave.properties"
printf '+ %s\n' "(cd master && pymetaq server -f server.ini > server.log 2>&1 &)"
printf '+ %s\n' "(cd slave && pymetaq server -f server.ini -Fmetaslave=async_slave.properties > server.log 2>&1 &)"
start slave -Fmetaslave=async_slave.properties
show "seq 1 1000 | sed 's/^/order-/' | pymetaq produce --server meta://127.0.0.1:${PORT[0]} --topic orders --batch 100"
wait_until 60 "the slave caught up" caught_up "${PORT[1]}"
show "pymetaq stats replication --server meta://127.0.0.1:${PORT[1]}"
show "for f in master/data/orders-*/*.meta; do cmp \$f slave/\${f#master/}; done && echo identical"
show "echo x | pymetaq produce --server meta://127.0.0.1:${PORT[1]} --topic orders || echo \"exit \$?\""
cat >read_from_slave.py <<EOF
from pymetaq.client import Consumer

with Consumer("$URL", "reports", read_from_slaves=True) as consumer:
    consumer.subscribe("orders")
    got = []
    for _ in range(20):  # until all 1,000 are in (each poll returns what one fetch brought)
        got += consumer.poll(5.0)
        if len(got) >= 1000:
            break
    print(len(got), "messages, from", min(m.value for m in got), "to", max(m.value for m in got))
EOF
show "cat read_from_slave.py"
show "$PY read_from_slave.py"
show "pymetaq verify --master 127.0.0.1:${PORT[0]} --slave 127.0.0.1:${PORT[1]}"

echo
echo "# a synchronous pair"
write_ini gregor 1 "${PORT[2]}" false
write_ini samsa 1 "${PORT[3]}" false
: >gregor/gregor_slave.properties
printf 'slave=127.0.0.1:%s\nsendToSlaveTimeoutInMills=2000\n' "${PORT[2]}" >samsa/samsa_master.properties
show "cat samsa/samsa_master.properties"
printf '+ %s\n' "(cd gregor && pymetaq server -f server.ini -Fgregor=gregor_slave.properties > server.log 2>&1 &)"
start gregor -Fgregor=gregor_slave.properties
printf '+ %s\n' "(cd samsa && pymetaq server -f server.ini -Fsamsa=samsa_master.properties > server.log 2>&1 &)"
start samsa -Fsamsa=samsa_master.properties
show "seq 1 1000 | sed 's/^/order-/' | pymetaq produce --server meta://127.0.0.1:${PORT[3]} --topic orders --batch 100"
show "pymetaq verify --strict --master 127.0.0.1:${PORT[3]} --slave 127.0.0.1:${PORT[2]}"
show 'kill $(cat gregor/pid)'
wait "$(cat gregor/pid)" 2>/dev/null || true
wait_until 30 "the master noticed" grep -q 'is unreachable' samsa/server.log
show "echo x | pymetaq produce --server meta://127.0.0.1:${PORT[3]} --topic orders || echo \"exit \$?\""
