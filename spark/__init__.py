"""pymetaq on Spark: format ``pymetaq`` for PySpark's Python Data Source API.

```python
from pymetaq.spark import register
register(spark)
df = spark.read.format("pymetaq").option("pymetaq.servers", "meta://127.0.0.1:8123") \
    .option("subscribe", "logs").load()
```

Without :func:`register`, the top-level module ``pyspark_pymetaq`` (installed with pymetaq)
lets Spark find the format by itself. Needs the ``spark`` extra (``pyspark>=4.2``,
``pyarrow``): importing this package without it raises
:class:`~pymetaq.client.errors.MissingDependency`.

Thread-safety: :func:`register` is called once per SparkSession, from the driver.
"""

from __future__ import annotations

from typing import Any

from pymetaq.client.errors import MissingDependency

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError as _e:  # pragma: no cover - exercised by a subprocess test
    raise MissingDependency("pymetaq.spark", _e.name or "pyspark", "spark") from None

from pymetaq.spark.source import PymetaqDataSource

__all__ = ["PymetaqDataSource", "register"]


def register(spark: Any) -> None:
    """Make ``format("pymetaq")`` available in ``spark`` (a ``SparkSession``)."""
    spark.dataSource.register(PymetaqDataSource)
