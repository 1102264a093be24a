"""The pipeline config: YAML in, typed models out, and every error names file, pipeline and field.

By concern: `base` the base model, checked field types and the one path rule (relative to the config
file); `sources` each source kind's `source:` model; `payload` the `schema:` block and its format
settings (`avro`, `protobuf`, `registry`); `changes` the checks of a target's mode (insert or upsert);
`models` the pipeline and the top level; `loader` the YAML
read and its errors, with `legacy` moving older configs' flat keys; `lakeurl` the lake's place on an
object store; `embedded` where the embedded services listen and how to log in to them. Secrets never
live in the YAML: a pipeline names an Airflow connection or an environment variable (deltadrain.secrets)."""

from deltadrain.config.base import (
    CONTINUOUS,
    CRON_PRESETS,
    NAME,
    ON_DATA,
    SECRET_KEYS,
    SPARK_TYPES,
    ConfigPath,
    IngestSchedule,
    NonNegativeDuration,
    PositiveDuration,
    Schedule,
    resolve_path,
)
from deltadrain.config.loader import load_config, parse_config
from deltadrain.config.models import (
    AirflowSettings,
    AlertSettings,
    DeleteWhen,
    DeltadrainConfig,
    Expectation,
    MaintenanceConfig,
    PipelineConfig,
    QualityConfig,
    ServicesConfig,
    SparkSettings,
    TargetConfig,
)
from deltadrain.config.payload import AvroSettings, Framing, ProtobufSettings, RegistrySettings, SchemaConfig
from deltadrain.config.sources import (
    SOURCE_KINDS,
    KafkaSecurity,
    KafkaSource,
    SourceSettings,
    ValkeySource,
    hash_tag,
    is_tls_url,
)

__all__ = [
    "AirflowSettings",
    "AlertSettings",
    "DeleteWhen",
    "AvroSettings",
    "CONTINUOUS",
    "ON_DATA",
    "CRON_PRESETS",
    "ConfigPath",
    "DeltadrainConfig",
    "Expectation",
    "Framing",
    "IngestSchedule",
    "KafkaSecurity",
    "KafkaSource",
    "MaintenanceConfig",
    "NAME",
    "NonNegativeDuration",
    "PipelineConfig",
    "PositiveDuration",
    "ProtobufSettings",
    "QualityConfig",
    "RegistrySettings",
    "SECRET_KEYS",
    "SOURCE_KINDS",
    "SPARK_TYPES",
    "Schedule",
    "SchemaConfig",
    "ServicesConfig",
    "SourceSettings",
    "SparkSettings",
    "TargetConfig",
    "ValkeySource",
    "hash_tag",
    "is_tls_url",
    "load_config",
    "parse_config",
    "resolve_path",
]
