"""pymetaq.ha."""
