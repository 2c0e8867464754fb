"""What enqueue_dataframe checks of its DataFrame on the driver, before any executor writes a row:
the columns' types, the unique keys, and names to refer to columns by."""

from __future__ import annotations

from collections.abc import Iterator

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    CalendarIntervalType,
    CharType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    MapType,
    NullType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
    YearMonthIntervalType,
)

from jobqueue.errors import ConfigurationError

# What PySpark hands to Python as a value the JSON serializer takes (str, int, float, bool, None,
# Decimal, date, datetime, bytes), besides arrays, maps and structs of them.
JSON_TYPES = (
    StringType,
    CharType,
    VarcharType,
    BinaryType,
    BooleanType,
    IntegralType,
    FloatType,
    DoubleType,
    DecimalType,
    DateType,
    TimestampType,
    TimestampNTZType,
    NullType,
)
# What PySpark cannot hand to Python at all, whatever the serializer.
NO_PYTHON_TYPES = (YearMonthIntervalType, CalendarIntervalType)
MAX_KEY_CHARACTERS = 255


def column(name: str) -> Column:
    """The column called ``name``, whatever it holds (a dot, a backtick): not parsed as a path."""
    return F.col("`" + name.replace("`", "``") + "`")


def check_types(df: DataFrame, names: list[str], serializer: str, task_name: str) -> None:
    """Raise ConfigurationError, naming the column, its field and the fix, if a column among
    ``names`` holds values the serializer cannot write (or PySpark cannot hand to Python)."""
    types = {field.name: field.dataType for field in df.schema.fields}
    for name in dict.fromkeys(names):
        for path, data_type, in_key in _leaves(types[name], "", in_key=False):
            where = f"task {task_name}: column {name!r}" + (f", field {path}" if path else "")
            if in_key and isinstance(data_type, ArrayType):
                raise ConfigurationError(
                    f"{where} ({data_type.simpleString()}): a map whose keys are arrays cannot be handed "
                    "to Python (a list is no dict key); turn the keys into strings first, e.g. "
                    "F.transform_keys(F.col(...), lambda k, v: k.cast('string')); nothing was enqueued"
                )
            if isinstance(data_type, NO_PYTHON_TYPES) or (
                serializer == "json" and not isinstance(data_type, (*JSON_TYPES, ArrayType))
            ):
                raise ConfigurationError(
                    f"{where} ({data_type.simpleString()}) holds values the {serializer} serializer "
                    "cannot write; cast it to a string or a number first, e.g. F.col(...).cast('string'); "
                    "nothing was enqueued"
                )


def _leaves(data_type: DataType, path: str, in_key: bool) -> Iterator[tuple[str, DataType, bool]]:
    """Every type within ``data_type`` that is not a struct or a map, with its path and whether it
    is part of a map's key; an array, then what it holds."""
    if isinstance(data_type, StructType):
        for field in data_type.fields:
            yield from _leaves(field.dataType, f"{path}.{field.name}" if path else field.name, in_key)
    elif isinstance(data_type, MapType):
        yield from _leaves(data_type.keyType, f"{path}[key]", True)
        yield from _leaves(data_type.valueType, f"{path}[value]", in_key)
    else:
        yield path, data_type, in_key
        if isinstance(data_type, ArrayType):
            yield from _leaves(data_type.elementType, f"{path}[]", in_key)


def check_keys(df: DataFrame, name: str, task_name: str) -> None:
    """Raise ConfigurationError, counting each kind, if some unique keys (the column ``name`` cast
    to a string) are null, empty, too long or hold a NUL character: one pass of Spark's own, run
    before any row is written, so that a bad key refuses the whole DataFrame."""
    kind = next((field.dataType for field in df.schema.fields if field.name == name), None)
    if isinstance(kind, BinaryType):
        # Cast to a string, bytes that are not UTF-8 become U+FFFD: distinct keys would merge.
        raise ConfigurationError(
            f"task {task_name}: unique_key column {name!r} is BINARY, whose bytes would be read as UTF-8 "
            f"text (keys that are not UTF-8 merged into one); nothing was enqueued. Give a text column: "
            f"F.hex(F.col({name!r})) or F.base64(F.col({name!r}))"
        )
    key = column(name).cast("string")
    length = F.length(key)
    counts = df.select(
        F.count(F.lit(1)).alias("rows"),
        F.count_if(key.isNull()).alias("null"),
        F.count_if(length == 0).alias("empty"),
        F.count_if(length > MAX_KEY_CHARACTERS).alias(f"longer than {MAX_KEY_CHARACTERS} characters"),
        F.count_if(key.contains("\x00")).alias("with a NUL character"),
    ).first()
    assert counts is not None  # an aggregate without grouping has one row
    bad = [f"{counts[kind]:,} {kind}" for kind in counts.asDict() if kind != "rows" and counts[kind]]
    if bad:
        listed = ", ".join(bad[:-1]) + " and " + bad[-1] if len(bad) > 1 else bad[0]
        raise ConfigurationError(
            f"task {task_name}: unique_key column {name!r} holds {listed}, of {counts['rows']:,} rows; "
            f"nothing was enqueued. A key is a string of 1 to {MAX_KEY_CHARACTERS} characters without "
            f"NUL: filter or fix those rows first, e.g. df.where(F.col({name!r}).isNotNull())"
        )
