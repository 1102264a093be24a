"""The column types a pipeline may declare (`schema.fields`, a `type` expectation): the one list that the
config validates against and that every other table of types derives from or is checked against
(the formats' converters, the evolution's fillable columns, the quality checks' Spark classes;
tests/unit/test_types.py ties them).
"""

from __future__ import annotations

# Each type as a table's column is called -> the class Spark gives such a column in a DataFrame's schema
# (what the quality checks' `type` expectation compares with).
SPARK_CLASSES = {
    "string": "StringType", "long": "LongType", "int": "IntegerType", "double": "DoubleType",
    "float": "FloatType", "boolean": "BooleanType", "timestamp": "TimestampType", "date": "DateType",
    "binary": "BinaryType", "decimal(18,2)": "DecimalType", "decimal(38,9)": "DecimalType",
}
# Other names the config takes for a type -> the column's own name: Delta's log calls an int column
# "integer", and the config accepts that spelling too. A table's column never carries an alias, so an
# alias is deliberately not a fillable column type.
ALIASES = {"integer": "int"}
# Every name the config accepts.
COLUMN_TYPES = frozenset(SPARK_CLASSES) | frozenset(ALIASES)


def column_type(name: str) -> str:
    """A declared type or a Delta log's type name -> the column's own name ("integer" -> "int")."""
    return ALIASES.get(name, name)


def spark_class(name: str) -> str:
    """The Spark type class of a column of a declared type."""
    return SPARK_CLASSES[column_type(name)]


def decimal_of(name: str) -> tuple[int, int] | None:
    """(precision, scale) of a decimal type's name, None for another type."""
    if not name.startswith("decimal(") or not name.endswith(")"):
        return None
    precision, _, scale = name[len("decimal("):-1].partition(",")
    return int(precision), int(scale)
