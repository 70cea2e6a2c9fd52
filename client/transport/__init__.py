"""The client's transport: connections, the loop thread, the broker set, the record codec.

| module | its one job |
|---|---|
| ``servers`` | ``parse_servers("meta://h:p,...")``, ``zk_servers(servers)``, ``parse_stats(body)`` (pure) |
| ``connection`` | ``BrokerConnection``: one pipelined asyncio connection (opaque matching); ``raise_for_reply`` |
| ``loop`` | ``LoopThread``: an asyncio loop in a daemon thread (one per synchronous client) |
| ``brokers`` | ``BrokerSet``: connections to all brokers, broker ids, partition lists |
| ``zkbrokers`` | ``ZkBrokerSet``: the same for a ``zk://`` cluster (brokers and partitions from ZooKeeper); ``open_broker_set(servers, side=)`` picks one |
| ``records`` | building records (``build_record``, ``build_records``, ``compress_batch``) and decoding them (``decode_messages``) |

``BrokerSet`` (asyncio, one loop): ``await start()``; ``await partitions(topic, refresh=False)``
-> sorted partitions; ``cached_partitions(topic)`` (any thread, no I/O); ``await
connection(broker_id)`` / ``cached_connection(broker_id)``; ``invalidate(topic)`` (background
refresh); ``brokers`` -> {id: url}; ``close()``. ``BrokerConnection``: ``await open(host, port,
connect_timeout_s=, limits=)``, ``send_request(cmd, timeout_s, on_done=None)`` ->
``asyncio.Future`` (``on_done(fut)`` runs once it is settled, from the reply handler itself),
``await request(cmd, timeout_s)``, ``send_oneway(cmd)``, ``close()``, ``closed``; the command's
``opaque`` is replaced by the connection's counter.

Import the names from their modules; this package module imports nothing (so importing one
piece never loads the others).

Thread-safety: connections and broker sets belong to one event loop; values and functions are
thread-safe; ``LoopThread`` is thread-safe.
"""
