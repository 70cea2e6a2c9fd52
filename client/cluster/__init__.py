"""pymetaq.client.cluster: the client side of MetaQ's ZooKeeper cluster (``zk://``).

Components with narrow interfaces, wired into producers, consumers and the CLI by their
owners (kazoo, the ``zk`` extra, is imported only when a component talks to ZooKeeper):

- :mod:`.assignors` — pure assignment functions: MetaQ's DEFAULT and CONSIST exactly, and
  pymetaq's STICKY; :func:`get_assignor` by name.
- :mod:`.session` — :func:`connect` (a kazoo client for a ``zk://`` URL) and the
  :class:`RefreshLoop` every component re-reads ZooKeeper with.
- :mod:`.discovery` — :class:`BrokerDiscovery`: partitions and broker addresses of topics from
  ``topics-pub`` (producers) or ``topics-sub`` (consumers), with a change callback.
- :mod:`.group` — :class:`GroupCoordinator`: consumer-group membership, rebalancing and the
  fenced hand-off through ``on_assign``/``on_revoke``/``on_lost`` callbacks.
- :mod:`.snapshot` — :func:`read_cluster`: everything registered, for ``pymetaq cluster``.

The ZooKeeper layout itself (paths, values, ``zk://`` parsing) is
:mod:`pymetaq.client.protocol.zk`.  See ``docs/cluster.md``.

Thread-safety: see each module.
"""

from pymetaq.client.cluster.assignors import CONSIST, DEFAULT, STICKY, Assignor, get_assignor
from pymetaq.client.cluster.discovery import BrokerDiscovery, TopicView
from pymetaq.client.cluster.errors import ClusterError, ClusterUnavailable, MembershipConflict
from pymetaq.client.cluster.group import GroupConfig, GroupCoordinator, make_consumer_id
from pymetaq.client.cluster.session import RefreshLoop, connect

__all__ = [
    "CONSIST",
    "DEFAULT",
    "STICKY",
    "Assignor",
    "BrokerDiscovery",
    "ClusterError",
    "ClusterUnavailable",
    "GroupConfig",
    "GroupCoordinator",
    "MembershipConflict",
    "RefreshLoop",
    "TopicView",
    "connect",
    "get_assignor",
    "make_consumer_id",
]
