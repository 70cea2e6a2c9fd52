"""Monitoring and operations: consumer lag from gets, per-partition traffic out, closed
partitions and the admin actions, the Prometheus collector, the dashboard's views.

| module      | owns                                                                   |
|-------------|------------------------------------------------------------------------|
| ``state``   | :class:`Monitor`: what the dispatcher records on the request paths     |
| ``lag``     | the bounded (group, topic, partition) position map and the lag rows    |
| ``ops``     | closed partitions and the ``admin`` actions                            |
| ``views``   | plain-data views of the broker (dashboard JSON and pages, ``top``)     |
| ``rates``   | the 1 s sampler behind the dashboard's rates                           |
| ``metrics`` | the Prometheus collector (everything read at scrape time)              |

Nothing here is imported by the put path except :class:`Monitor`; ``metrics`` (and so
``prometheus_client``) only when the HTTP port is on.
"""
