"""One list of column types (deltadrain.schema.types): the config accepts exactly those, and every other
table of types (the formats' converters and what fills each type, the evolution's fillable columns, the
quality checks' Spark classes) covers each of them."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pyspark.sql import types as spark_types

from deltadrain.config import SPARK_TYPES, Expectation, SchemaConfig
from deltadrain.formats import avro, protobuf
from deltadrain.formats.decode import CONVERTERS
from deltadrain.quality.checks import SPARK_TYPE_CLASS
from deltadrain.schema.evolution import FILLABLE, table_type
from deltadrain.schema.types import ALIASES, COLUMN_TYPES, SPARK_CLASSES, column_type, decimal_of


def test_every_supported_type_has_a_converter_a_spark_class_and_a_column():
    assert SPARK_TYPES == COLUMN_TYPES
    assert set(CONVERTERS) == COLUMN_TYPES and set(SPARK_TYPE_CLASS) == COLUMN_TYPES
    assert all(hasattr(spark_types, cls) for cls in SPARK_TYPE_CLASS.values())
    # What fills each type, by the Avro and the Protobuf kind of a field.
    assert set(avro.ACCEPTS) == COLUMN_TYPES and set(protobuf.ACCEPTS) == COLUMN_TYPES
    # A run fills every type under its column's own name; an alias is deliberately not fillable: a table's
    # column never carries it (Delta's "integer" is read as "int").
    assert set(SPARK_CLASSES) == FILLABLE and FILLABLE | set(ALIASES) == COLUMN_TYPES and not FILLABLE & set(ALIASES)
    for alias, column in ALIASES.items():
        assert column in FILLABLE and column_type(alias) == column and table_type(alias) == column
        assert CONVERTERS[alias] is CONVERTERS[column] and SPARK_TYPE_CLASS[alias] == SPARK_TYPE_CLASS[column]


@pytest.mark.parametrize("name", sorted(n for n in COLUMN_TYPES if n.startswith("decimal")))
def test_a_decimal_type_converts_to_its_own_precision_and_scale(name):
    precision, scale = decimal_of(name)
    convert = CONVERTERS[name]
    assert convert("1." + "5" * scale) == Decimal("1." + "5" * scale)
    with pytest.raises(TypeError):
        convert("1." + "5" * (scale + 1))  # a digit past the scale is never rounded away
    with pytest.raises(TypeError):
        convert("9" * (precision - scale + 1))  # more digits than the column holds
    assert SPARK_TYPE_CLASS[name] == "DecimalType"


def test_the_config_takes_exactly_the_supported_types():
    for name in COLUMN_TYPES:
        assert SchemaConfig(id_field="id", fields={"id": "string", "x": name.upper()}).fields["x"] == name
        assert Expectation(column="x", kind="type", type=name).type == name
    for name in ("decimal(10,2)", "varchar", "map<string,string>"):
        with pytest.raises(ValueError, match="unknown types"):
            SchemaConfig(id_field="id", fields={"id": "string", "x": name})
        with pytest.raises(ValueError, match="type needs type, one of"):
            Expectation(column="x", kind="type", type=name)
