#!/usr/bin/env bash
# Automatic failover and rejoin on one machine: a synchronous pair (samsa master, gregor
# slave) with ZooKeeper; the master hangs (SIGSTOP) past its session timeout, the slave takes
# over; woken (SIGCONT), the old master cuts what the new one never got and follows it as its
# synchronous slave.  Every command it runs is printed with "+ " before its output;
# docs/replication.md shows a run and tests/ha/test_docs.py runs it.
#
#   ZK=127.0.0.1:2181 PORTS="18310 18311" bash examples/failover_walkthrough.sh
#
# ZK: a running ZooKeeper (host:port, optionally with a chroot); PORTS: two free ports (the
# gregor slave, the samsa master); DEMO_DIR: where the brokers' directories go (default
# ./failover-demo, created afresh).  Everything it starts is stopped when it exits.
set -euo pipefail

read -r -a PORT <<<"${PORTS:-18310 18311}"
DEMO_DIR=${DEMO_DIR:-failover-demo}
# shellcheck source=examples/walkthrough_lib.sh
source "$(dirname "$0")/walkthrough_lib.sh"

write_ini() { # write_ini <dir> <port>
    mkdir -p "$1"
    cat >"$1/server.ini" <<EOF
[system]
brokerId=2
hostName=127.0.0.1
serverPort=$2
dataPath=data
unflushThreshold=0
dashboardHttpPort=0

[zookeeper]
zk.zkEnable=true
zk.zkConnect=$ZK
zk.zkSessionTimeoutMs=4000
zk.zkSyncTimeMs=100

[topic=orders]
numPartitions=2
EOF
}

write_ini gregor "${PORT[0]}"
write_ini samsa "${PORT[1]}"
: >gregor/gregor_slave.properties
printf 'slave=127.0.0.1:%s\n' "${PORT[0]}" >samsa/samsa_master.properties
printf '+ %s\n' "(cd gregor && pymetaq server -f server.ini -Fgregor=gregor_slave.properties > server.log 2>&1 &)"
start gregor -Fgregor=gregor_slave.properties
printf '+ %s\n' "(cd samsa && pymetaq server -f server.ini -Fsamsa=samsa_master.properties > server.log 2>&1 &)"
start samsa -Fsamsa=samsa_master.properties
wait_until 30 "the slave watches its master" grep -q 'samsa: the slave .* takes bsync' samsa/server.log
show "seq 1 1000 | sed 's/^/order-/' | pymetaq produce --server meta://127.0.0.1:${PORT[1]} --topic orders --batch 100"
show 'kill -STOP $(cat samsa/pid)'
wait_until 60 "the promotion" grep -q 'is the master (epoch 2)' gregor/server.log
wait_until 30 "the new master registered" grep -q 'registered broker 2' gregor/server.log
show "pymetaq stats replication --server meta://127.0.0.1:${PORT[0]}"
show "seq 1001 1500 | sed 's/^/order-/' | pymetaq produce --server meta://127.0.0.1:${PORT[0]} --topic orders --batch 100"
show 'kill -CONT $(cat samsa/pid)'
wait_until 60 "the old master rejoined" grep -q 'is the in-sync slave' gregor/server.log
show "grep -o 'rejoin: .*' samsa/server.log"
show "echo x | pymetaq produce --server meta://127.0.0.1:${PORT[1]} --topic orders || echo \"exit \$?\""
show "seq 1501 1600 | sed 's/^/order-/' | pymetaq produce --server meta://127.0.0.1:${PORT[0]} --topic orders --batch 100"
show "pymetaq stats replication --server meta://127.0.0.1:${PORT[0]}"
show "pymetaq verify --strict --master 127.0.0.1:${PORT[0]} --slave 127.0.0.1:${PORT[1]}"
