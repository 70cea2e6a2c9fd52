"""``PymetaqDataSource``: format ``pymetaq`` for PySpark's Python Data Source API (batch and
streaming, read and write).

Options are parsed and checked here, on the driver, before Spark plans anything: a bad option
is a :class:`~pymetaq.spark.options.SparkOptionError` naming it. See
:mod:`pymetaq.spark.options` for the options, :mod:`pymetaq.spark.schema` for the rows.

Thread-safety: Spark creates a data source per query; it holds only its options.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from pymetaq.spark.options import read_options, write_options
from pymetaq.spark.schema import SCHEMA_DDL


class PymetaqDataSource(DataSource):
    """``spark.read.format("pymetaq")`` and friends (register it with
    :func:`pymetaq.spark.register`)."""

    @classmethod
    def name(cls) -> str:
        return "pymetaq"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        from pymetaq.spark.batch_reader import BatchReader

        return BatchReader(read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from pymetaq.spark.stream_reader import StreamReader

        return StreamReader(read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from pymetaq.spark.writer import BatchWriter, check_sink_schema

        check_sink_schema(schema, overwrite)
        return BatchWriter(write_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from pymetaq.spark.writer import StreamWriter, check_sink_schema

        check_sink_schema(schema, overwrite)
        opts = write_options(self.options, streaming=True)
        if opts.exactly_once:
            from pymetaq.spark.writer import ExactlyOnceStreamWriter

            return ExactlyOnceStreamWriter(opts)
        return StreamWriter(opts)
