"""pymetaq.server."""
