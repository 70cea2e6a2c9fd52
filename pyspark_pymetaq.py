"""Spark's auto-registration hook for format ``pymetaq``: PySpark registers the
``DefaultSource`` of every top-level ``pyspark_*`` module on its path, so
``spark.read.format("pymetaq")`` works without :func:`pymetaq.spark.register`."""

from pymetaq.spark.source import PymetaqDataSource as DefaultSource

__all__ = ["DefaultSource"]
