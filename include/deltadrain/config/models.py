"""The config's models, from the top (DeltadrainConfig) down to each pipeline's blocks: the `source:`
models are in deltadrain.config.sources, the `schema:` block's in deltadrain.config.payload, and the
YAML is read into them by deltadrain.config.loader.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from deltadrain.config.base import (
    NAME,
    SPARK_TYPES,
    ConfigPath,
    IngestSchedule,
    Model,
    NonNegativeDuration,
    PositiveDuration,
    Schedule,
    resolve_path,
)
from deltadrain.config.changes import check_mode
from deltadrain.config.lakeurl import LakeUrl, is_s3_url
from deltadrain.config.payload import SchemaConfig
from deltadrain.config.sources import SourceSettings
from deltadrain.errors import ConfigError
from deltadrain.paths import state_home


class ServicesConfig(Model):
    """The embedded services; every port can also be set by DELTADRAIN_<NAME>_PORT."""

    valkey_port: int = Field(6399, ge=1, le=65535)
    # The embedded Valkey over TLS: a terminator (stunnel) on this port in front of valkey_port.
    valkey_tls_port: int = Field(6398, ge=1, le=65535)
    kafka_port: int = Field(19092, ge=1, le=65535)
    kafka_controller_port: int = Field(19093, ge=1, le=65535)
    kafka_sasl_port: int = Field(19094, ge=1, le=65535)
    airflow_port: int = Field(8088, ge=1, le=65535)
    # Not Spark's 15002, like the others are not their servers' usual ports: a user's own server keeps its port.
    spark_connect_port: int = Field(15012, ge=1, le=65535)
    s3_port: int = Field(19000, ge=1, le=65535)
    # The embedded Valkey Cluster's first port: six nodes listen on it and the five after it, their
    # cluster buses on the six after those.
    valkey_cluster_port: int = Field(16400, ge=1, le=65535 - 11)
    # The Spark standalone cluster (`services up --only spark_cluster`): its master's RPC port and web UI port.
    spark_cluster_port: int = Field(17077, ge=1, le=65535)
    spark_cluster_ui_port: int = Field(18080, ge=1, le=65535)
    # The embedded schema registry (`services up --only registry`): its Confluent-compatible API.
    registry_port: int = Field(18081, ge=1, le=65535)
    # Change data capture (docs/cdc-services.md): the embedded PostgreSQL, the Debezium worker's REST API, and
    # the tables it captures, `schema.table` (Debezium's table.include.list; empty: every table).
    postgres_port: int = Field(15432, ge=1, le=65535)
    debezium_port: int = Field(18083, ge=1, le=65535)
    debezium_tables: list[str] = []
    airflow_parallelism: int = Field(4, ge=1, le=64)
    kafka_heap: str = "512m"

    @field_validator("debezium_tables")
    @classmethod
    def _table_names(cls, tables: list[str]) -> list[str]:
        if bad := [t for t in tables if not re.fullmatch(r"[A-Za-z_]\w*\.[A-Za-z_]\w*", t)]:
            raise ValueError(f"services.debezium_tables takes schema.table names, not {bad}")
        return tables


class DeleteWhen(Model):
    """`target.delete_when`: in upsert mode, an event whose row has `field` equal to `equals` deletes its key
    (a soft-delete flag, an `op` field of the producer's own)."""

    field: str = Field(min_length=1)
    equals: str | int | bool


class TargetConfig(Model):
    # Relative paths sit under the lake directory (data_dir); an s3a:// URL is a table on the object store.
    path: str
    partition_by: list[str] = []
    cluster_by: list[str] = []
    # insert: every message once, keyed by its id (an event log). upsert: one row per `key`, in the state of
    # its newest event, with deletes (docs/cdc.md).
    mode: Literal["insert", "upsert"] = "insert"
    # upsert: the payload columns that identify a row; with schema.envelope debezium, unset: the record key's.
    key: list[str] = []
    # upsert: what orders a key's events: the source's position, a payload column (a version, a timestamp),
    # or with schema.envelope debezium `source.lsn` (the change's place in the database's log).
    order_by: str = "position"
    delete_when: DeleteWhen | None = None
    # upsert with schema.envelope debezium: what a truncate of the source table does (fail: the run stops).
    on_truncate: Literal["fail", "truncate"] = "fail"

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if is_s3_url(v):
            LakeUrl(v)
        return v


class Expectation(Model):
    column: str
    kind: Literal["not_null", "unique", "between", "in_set", "type", "fresh_within"]
    min: float | None = None
    max: float | None = None
    values: list[str | int | float] | None = None
    type: str | None = None
    within: timedelta | None = None

    @model_validator(mode="after")
    def _params(self):
        # Each kind's parameters are checked here so a bad suite fails at config load, not mid-run.
        if self.kind == "between" and self.min is None and self.max is None:
            raise ValueError(f"expectation '{self.column}' between needs min and/or max")
        if self.kind == "between" and None not in (self.min, self.max) and self.min > self.max:
            raise ValueError(f"expectation '{self.column}' between has min > max")
        if self.kind == "in_set" and not self.values:
            raise ValueError(f"expectation '{self.column}' in_set needs values")
        if self.kind == "type" and (self.type or "").lower() not in SPARK_TYPES:
            raise ValueError(f"expectation '{self.column}' type needs type, one of {sorted(SPARK_TYPES)}")
        if self.kind == "fresh_within" and (self.within is None or self.within.total_seconds() <= 0):
            raise ValueError(f"expectation '{self.column}' fresh_within needs a positive duration in within")
        return self


class QualityConfig(Model):
    # Empty means the default suite: id not null and unique, required columns present and typed.
    expectations: list[Expectation] = []
    on_failure: Literal["fail", "warn", "quarantine"] = "fail"


class AirflowSettings(Model):
    """How the pipeline's DAGs run in Airflow."""

    # Intervals start here; backfills can heal any interval after it that the source still retains.
    start_date: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    retries: int = Field(2, ge=0, le=20)
    retry_delay: NonNegativeDuration = timedelta(seconds=30)  # doubled on each retry (exponential backoff)
    max_retry_delay: PositiveDuration = timedelta(minutes=10)
    execution_timeout: PositiveDuration = timedelta(minutes=30)
    # How long the sensor waits for work before the run is skipped, and how often it looks. Under on_data,
    # how often the AssetWatcher's trigger looks, and how long work may stay unchanged before it wakes the
    # DAG for it again (a run that failed).
    wait_timeout: PositiveDuration = timedelta(minutes=4)
    poll_interval: PositiveDuration = timedelta(seconds=10)
    # Catch-up: a drain task goes on with another batch while the last one was full (more is waiting),
    # up to this many batches and none started after max_drain_time, in one Spark session: a backlog
    # pays the JVM start and the cold first batch once. Each batch is its own commit and quality check.
    max_batches_per_run: int = Field(10, ge=1, le=1000)
    max_drain_time: PositiveDuration = timedelta(minutes=10)

    @field_validator("start_date")
    @classmethod
    def _aware(cls, v):
        return v if v.tzinfo else v.replace(tzinfo=UTC)

    @model_validator(mode="after")
    def _drain_time_fits(self):
        if self.max_drain_time >= self.execution_timeout:
            raise ValueError(f"max_drain_time ({self.max_drain_time}) must be shorter than execution_timeout "
                             f"({self.execution_timeout}): the last batch started must still finish in the task")
        return self


class AlertSettings(Model):
    """The ingest DAG's `alerts` task (deltadrain.observe.alerts): after each drain, it fails with the figure when one
    of these is passed. Each is off while unset: what is too much lag or too old a message depends on the
    pipeline's rate and schedule, which deltadrain cannot guess, and an alert that fires on every backlog
    is one nobody reads. With none set the ingest DAG has no `alerts` task."""

    # Messages not in the lake yet (PENDING + CLAIMED: the view's lag) above this fail the check.
    max_lag: int | None = Field(None, ge=0)
    # The oldest message not in the lake yet appended longer ago than this fails it.
    max_pending_age: PositiveDuration | None = None
    # DEAD dead letters rising by more than this since the previous check (the DLQ table as it was when
    # this DAG run started) fail it; 0: any new dead letter does.
    max_dead_rise: int | None = Field(None, ge=0)

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.max_lag, self.max_pending_age, self.max_dead_rise))


class PipelineConfig(Model):
    name: str
    source: SourceSettings
    target: TargetConfig
    payload_schema: SchemaConfig = Field(alias="schema")
    transform: str | None = None
    # Messages per batch, i.e. per commit. A batch costs the Spark JVM a fixed share of query planning
    # and JIT compiling, which a larger cap pays less often, so a backlog drains faster with one (the
    # measured rates: docs/benchmarks.md, bench/batch_sizes/README.md). The driver's memory does not
    # grow with it; a larger batch is a larger unit to redeliver after a failure.
    batch_cap: int = Field(10_000, ge=1, le=10_000_000)
    max_retries: int = Field(3, ge=0, le=100)
    min_idle_ms: int = Field(60_000, ge=0)
    # The MERGE looks back this far from the batch's oldest message; a negative window would look past
    # it and insert redeliveries again.
    dedup_window: NonNegativeDuration = timedelta(days=7)
    max_message_bytes: int = Field(1_048_576, ge=64)
    quality: QualityConfig = QualityConfig()
    # A cron expression, a preset, "@continuous" (the next run starts when one ends, and its sensor
    # waits for work) or "on_data" (a run starts when the source's Assets get an event from their
    # watcher): docs/airflow.md, "Event-driven ingest".
    schedule: IngestSchedule = "*/5 * * * *"
    airflow: AirflowSettings = AirflowSettings()
    alerts: AlertSettings = AlertSettings()

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not NAME.match(v):
            raise ValueError("must be lower-case letters, digits and _ (it names DAGs, tables and pools)")
        return v

    @field_validator("transform")
    @classmethod
    def _transform(cls, v):
        if v is not None and not re.match(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+$", v):
            raise ValueError("must be a dotted path module.function")
        return v

    @model_validator(mode="after")
    def _keys(self):
        if getattr(self.source, "key_format", "text") == "avro" and self.payload_schema.registry is None:
            raise ValueError("source.key_format avro reads each key with its writer's schema from the schema "
                             "registry: set schema.registry.url")
        return self

    @model_validator(mode="after")
    def _mode(self):
        check_mode(self)
        return self

    @property
    def upsert(self) -> bool:
        return self.target.mode == "upsert"

    @model_validator(mode="after")
    def _evolution(self):
        if self.payload_schema.evolution == "add_columns" and self.transform is not None:
            raise ValueError("schema.evolution add_columns cannot go with a transform: the columns a transform "
                             "adds and a payload's new fields would share the table's names; use evolution: none")
        return self

    @model_validator(mode="after")
    def _layout(self):
        # A transform may add the columns a layout names; without one, they are the payload's or ours.
        if self.transform is None:
            for name in ("partition_by", "cluster_by"):
                unknown = [c for c in getattr(self.target, name)
                           if c not in self.payload_schema.fields and not c.startswith("_dd_")]
                if unknown:
                    raise ValueError(f"target.{name} names {unknown}, which are not fields of the schema "
                                     "(and no transform adds columns)")
        return self

    def connection_ids(self) -> list[str]:
        """The Airflow connections the source's and the schema registry's credentials come from."""
        registry = self.payload_schema.registry
        conn_ids = [self.source.connection_id_used(), registry.connection_id if registry else None]
        return [c for c in conn_ids if c]

    def accepting_gaps(self) -> PipelineConfig:
        """This pipeline under on_gap: continue, for the runs an operator starts to go on past the gaps
        that stopped it (their commit records them); the config file keeps its own policy."""
        return self.model_copy(update={"source": self.source.model_copy(update={"on_gap": "continue"})})


class MaintenanceConfig(Model):
    """Table maintenance (the `deltadrain__maintenance` DAG, `deltadrain maintain`): every batch adds
    files to the target, the DLQ and the run metrics; compacting them keeps reads and the MERGE's
    file pruning fast, and VACUUM deletes the files compaction replaced once no reader can need them."""

    schedule: Schedule = "@daily"
    optimize: bool = True
    vacuum: bool = True
    # How long replaced files stay (Delta's time travel reaches back this far). Delta refuses less than
    # 7 days unless told otherwise; deltadrain tells it when this is set lower, so set it above the
    # longest run that reads these tables (a drain task's execution_timeout, a replay).
    retain: NonNegativeDuration = timedelta(days=7)


class SparkSettings(Model):
    """Where the DAGs' Spark jobs run (docs/spark-connect.md)."""

    # connect: the Airflow task is a client of a long-lived Spark Connect server (the `connect_conn_id`
    # connection; `services up` starts one). submit: each task starts a driver with spark-submit on the
    # `submit_conn_id` connection's master (YARN, Kubernetes, a standalone master, local).
    executor: Literal["connect", "submit"] = "connect"
    connect_conn_id: str = Field("spark_connect", min_length=1)
    submit_conn_id: str = Field("spark_default", min_length=1)


class DeltadrainConfig(Model):
    # The lake's directory, relative to the config file, or an s3a:// URL; unset: $DELTADRAIN_HOME/lake.
    data_dir: ConfigPath = None
    services: ServicesConfig = ServicesConfig()
    spark: SparkSettings = SparkSettings()
    maintenance: MaintenanceConfig = MaintenanceConfig()
    pipelines: list[PipelineConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self):
        names = [p.name for p in self.pipelines]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            where = ", ".join(f"pipelines[{i}].name" for i, n in enumerate(names) if n in dupes)
            raise ValueError(f"pipeline names must be unique; repeated: {dupes} ({where})")
        return self

    # Resolved at load time, not part of the YAML.
    source_file: Path | None = Field(None, exclude=True)

    @field_validator("data_dir")
    @classmethod
    def _data_dir(cls, v: str | None) -> str | None:
        if v is not None and is_s3_url(v):
            LakeUrl(v)  # a bucket, and no '.' or '..' (s3:// is read as s3a://, the scheme Spark reaches it by)
        return v

    def lake_dir(self) -> Path | LakeUrl:
        """The lake's directory, or its place on the object store when data_dir is an s3a:// URL."""
        if self.data_dir and is_s3_url(self.data_dir):
            return LakeUrl(self.data_dir)
        if self.data_dir:  # already absolute when loaded from a file; not when built in code
            return Path(resolve_path(self.data_dir, self.source_file))
        return (state_home() / "lake").resolve()

    def pipeline(self, name: str) -> PipelineConfig:
        for p in self.pipelines:
            if p.name == name:
                return p
        raise ConfigError(f"{self.source_file}: no pipeline named '{name}' "
                          f"(configured: {', '.join(p.name for p in self.pipelines)})")

    def target_path(self, pipeline: PipelineConfig) -> Path | LakeUrl:
        if is_s3_url(pipeline.target.path):
            return LakeUrl(pipeline.target.path)
        path = Path(pipeline.target.path).expanduser()
        return path if path.is_absolute() else self.lake_dir() / path

    @property
    def on_object_store(self) -> bool:
        """Whether the lake (or a target table) lies on the object store: Spark sessions then need hadoop-aws."""
        return isinstance(self.lake_dir(), LakeUrl) or any(is_s3_url(p.target.path) for p in self.pipelines)

    def dlq_path(self, pipeline: PipelineConfig) -> Path | LakeUrl:
        return self.lake_dir() / "_deltadrain" / "dlq" / pipeline.name

    def tombstones_path(self, pipeline: PipelineConfig) -> Path | LakeUrl:
        """Where an upsert pipeline remembers the deletes it applied (deltadrain.run.apply_upsert)."""
        return self.lake_dir() / "_deltadrain" / "tombstones" / pipeline.name

    def quarantine_path(self, pipeline: PipelineConfig) -> Path | LakeUrl:
        """Where the batch checks move rows that break the pipeline's suite (`quality.quarantine.quarantine`)."""
        return self.lake_dir() / "_deltadrain" / "quarantine" / pipeline.name

    def metrics_path(self) -> Path | LakeUrl:
        """The per-run metrics table of every pipeline (deltadrain.lake.metrics)."""
        return self.lake_dir() / "_deltadrain" / "metrics"

    def quality_results_path(self) -> Path | LakeUrl:
        """The batch checks' results table of every pipeline (deltadrain.quality.results)."""
        return self.lake_dir() / "_deltadrain" / "quality" / "results"
