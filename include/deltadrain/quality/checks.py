"""The suite, in deltadrain's terms (pure): a pipeline's checks, each one's GX expectation and Spark violation.

The suite comes from the pipeline's `quality` config (build_checks); with no expectations declared,
the default suite checks the message id (not null, unique) and the required columns (present, typed,
not null).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from deltadrain.config import PipelineConfig
from deltadrain.schema.types import COLUMN_TYPES, spark_class

ROW_LEVEL = ("not_null", "unique", "between", "in_set")  # a failing row can be named and moved
# A declared type -> the Spark class GX's type expectation compares a column with.
SPARK_TYPE_CLASS = {name: spark_class(name) for name in COLUMN_TYPES}


@dataclass(frozen=True)
class Check:
    """One expectation of a suite: what it checks, and its name in logs, errors and the results table."""

    kind: str  # not_null | unique | between | in_set | type | exists | fresh_within
    column: str
    min: float | None = None
    max: float | None = None
    values: tuple = ()
    type: str | None = None
    within: timedelta | None = None

    @property
    def row_level(self) -> bool:
        return self.kind in ROW_LEVEL

    @property
    def name(self) -> str:
        if self.kind == "between":
            return f"{self.column} between {self.min} and {self.max}"
        if self.kind == "in_set":
            return f"{self.column} in {list(self.values)}"
        if self.kind == "type":
            return f"{self.column} is {self.type}"
        if self.kind == "fresh_within":
            return f"{self.column} newest within {self.within}"
        return f"{self.column} {self.kind.replace('_', ' ')}"


def suite_name(pipeline: PipelineConfig) -> str:
    return f"deltadrain_{pipeline.name}"


def default_checks(pipeline: PipelineConfig) -> list[Check]:
    schema = pipeline.payload_schema
    if pipeline.upsert:
        # A batch of an upsert target holds one row per key it wrote: the key's text identifies them.
        from deltadrain.formats.changes import KEY

        checks = [Check("not_null", KEY), Check("unique", KEY)]
        for column in dict.fromkeys([*pipeline.target.key, *schema.required]):
            checks += [Check("exists", column), Check("type", column, type=schema.fields[column]),
                       Check("not_null", column)]
        return checks
    checks = [Check("not_null", schema.id_field), Check("unique", schema.id_field)]
    for column in dict.fromkeys([schema.id_field, *schema.required]):
        checks += [Check("exists", column), Check("type", column, type=schema.fields[column])]
        if column != schema.id_field:
            checks.append(Check("not_null", column))
    return checks


def build_checks(pipeline: PipelineConfig) -> list[Check]:
    """The pipeline's suite: its declared expectations, or the default suite when it declares none."""
    declared = pipeline.quality.expectations
    if not declared:
        return default_checks(pipeline)
    return [Check(e.kind, e.column, e.min, e.max, tuple(e.values or ()), e.type.lower() if e.type else None,
                  e.within) for e in declared]


def gx_expectation(check: Check, index: int, now: datetime):
    """The GX expectation of a check; `meta.deltadrain` maps its result back to the check."""
    import great_expectations as gx

    ex, meta = gx.expectations, {"deltadrain": index}
    if check.kind == "not_null":
        return ex.ExpectColumnValuesToNotBeNull(column=check.column, meta=meta)
    if check.kind == "unique":
        return ex.ExpectColumnValuesToBeUnique(column=check.column, meta=meta)
    if check.kind == "between":
        return ex.ExpectColumnValuesToBeBetween(column=check.column, min_value=check.min, max_value=check.max,
                                                meta=meta)
    if check.kind == "in_set":
        return ex.ExpectColumnValuesToBeInSet(column=check.column, value_set=list(check.values), meta=meta)
    if check.kind == "type":
        assert check.type is not None  # the config requires it of this kind
        return ex.ExpectColumnValuesToBeOfType(column=check.column, type_=SPARK_TYPE_CLASS[check.type], meta=meta)
    if check.kind == "exists":
        return ex.ExpectColumnToExist(column=check.column, meta=meta)
    if check.kind == "fresh_within":
        assert check.within is not None  # the config requires it of this kind
        # PySpark hands timestamps to Python as naive local times, so "now" must be naive local too.
        return ex.ExpectColumnMaxToBeBetween(column=check.column, min_value=now - check.within, meta=meta)
    raise ValueError(f"unknown expectation kind {check.kind!r}")


def violation(check: Check, df):
    """A boolean Column: this row breaks `check` (row-level checks only; nulls break only not_null, as in GX)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    col = F.col(f"`{check.column}`")
    if check.kind == "not_null":
        return col.isNull()
    if check.kind == "unique":
        return col.isNotNull() & (F.count(F.lit(1)).over(Window.partitionBy(col)) > 1)
    if check.kind == "between":
        low = col < F.lit(check.min) if check.min is not None else F.lit(False)
        high = col > F.lit(check.max) if check.max is not None else F.lit(False)
        return col.isNotNull() & (low | high)
    if check.kind == "in_set":
        return col.isNotNull() & ~col.isin(list(check.values))
    raise ValueError(f"{check.kind} is not a row-level check")
