"""pymetaq.client.cluster: MetaQ's ZooKeeper cluster, client side (placeholder docstring)."""
