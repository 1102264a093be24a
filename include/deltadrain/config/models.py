"""The pipeline config: YAML in, typed models out, and every error names file, pipeline and field.

Secrets never live here. A password or SASL secret comes from an environment variable or an
Airflow connection named in the config (see deltadrain.secrets); a YAML key that looks like a
secret is refused with a message that says where to put it instead.
"""

from __future__ import annotations

import re
import urllib.parse
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from deltadrain.config.lakeurl import LakeUrl, is_s3_url
from deltadrain.errors import ConfigError
from deltadrain.paths import config_path, state_home

NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
SECRET_KEYS = {"password", "passwd", "secret", "sasl_password", "token", "api_key", "ssl_key_password"}
SPARK_TYPES = {"string", "long", "int", "integer", "double", "float", "boolean", "timestamp", "date",
               "binary", "decimal(18,2)", "decimal(38,9)"}


CRON_PRESETS = ("@hourly", "@daily", "@weekly", "@monthly", "@quarterly", "@yearly")  # Airflow's


# An ingest DAG that starts its next run as soon as one ends (Airflow's continuous timetable).
CONTINUOUS = "@continuous"


def _schedule(v: str | None) -> str | None:
    """A cron expression or one of Airflow's presets, checked here rather than as a broken DAG."""
    if v is None or v in CRON_PRESETS:
        return v
    try:
        from croniter import croniter  # Airflow's own cron parser; jobs may run without it
    except ImportError:  # pragma: no cover
        return v
    if not croniter.is_valid(v):
        raise ValueError(f"'{v}' is not a cron expression (such as '*/5 * * * *') or one of {', '.join(CRON_PRESETS)}")
    return v


def _positive(v: timedelta) -> timedelta:
    if v <= timedelta(0):
        raise ValueError(f"must be a positive duration, got {v}")
    return v


def _not_negative(v: timedelta) -> timedelta:
    if v < timedelta(0):
        raise ValueError(f"must not be negative, got {v}")
    return v


def _ingest_schedule(v):
    return v if v == CONTINUOUS else _schedule(v)


# Checked field types: the error names the field like any other (parse_config).
Schedule = Annotated[str | None, AfterValidator(_schedule)]
IngestSchedule = Annotated[str | None, AfterValidator(_ingest_schedule)]
PositiveDuration = Annotated[timedelta, AfterValidator(_positive)]
NonNegativeDuration = Annotated[timedelta, AfterValidator(_not_negative)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_secrets(cls, data):
        if isinstance(data, dict):
            for key in data:
                if str(key).lower() in SECRET_KEYS:
                    raise ValueError(
                        f"'{key}' is a secret and is never read from YAML; name an Airflow connection "
                        "(connection_id) or an environment variable (password_env) instead")
        return data


class ServicesConfig(_Model):
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
    airflow_parallelism: int = Field(4, ge=1, le=64)
    kafka_heap: str = "512m"


def hash_tag(key: str) -> str:
    """What Valkey Cluster hashes of a key: the part between the first '{' and the first '}' after
    it when that part is not empty (a hash tag), else the whole key."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1:end]
    return key


def is_tls_url(url: str) -> bool:
    return url.startswith(("valkeys://", "rediss://"))


def _valkey_url(v: str) -> str:
    if not re.match(r"^(valkey|valkeys|redis|rediss)://", v):
        raise ValueError("must start with valkey://, valkeys://, redis:// or rediss://")
    parts = urllib.parse.urlsplit(v)
    if parts.password is not None:
        raise ValueError("carries a password; put it in password_env or an Airflow connection")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        # valkey://user:pa/ss@host: the address ends at the "/", and "pa" would be taken for the
        # port (and printed in its error): a password with a "/" in it.
        raise ValueError("has a port that is not a number; a password in the URL? Put it in password_env "
                         "or an Airflow connection") from None
    if parts.fragment:
        raise ValueError("has a '#' part, which a Valkey URL does not use (a password there is not hidden)")
    # valkey-py also reads credentials from the query string (?password=..., ?username=...).
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    creds = sorted(k for k in query if k.lower() in SECRET_KEYS | {"username", "user"})
    if creds:
        raise ValueError(f"carries credentials in its query string ({', '.join(creds)}); name an environment "
                         "variable (password_env) or an Airflow connection (connection_id) instead")
    return v


class ValkeySource(_Model):
    kind: Literal["valkey"]
    # None means the embedded Valkey of `deltadrain services` (with cluster: true, its embedded cluster).
    # A cluster may be given by several seed URLs: the client finds every node from any one of them.
    url: str | list[str] | None = None
    # Valkey Cluster: each stream's commands go to the primary that owns its slot (docs/config.md).
    cluster: bool = False
    connection_id: str | None = None
    password_env: str | None = None
    streams: list[str] = Field(min_length=1)
    group: str = "deltadrain"
    # MAXLEN applied by producers (produce, replay); None keeps every entry.
    maxlen: int | None = Field(None, gt=0)
    # Entries deleted (trimming, XDEL) before a committed batch held them: fail stops the run, which
    # commits nothing, until the operator accepts the loss; continue carries the gap in the next commit.
    on_gap: Literal["fail", "continue"] = "fail"
    # TLS: a valkeys:// (rediss://) URL, or tls: true without a url for the embedded server's TLS port.
    tls: bool = False
    # The CA (PEM) the client trusts over TLS; unset: the system's (the embedded server's own CA for it).
    tls_ca_file: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, v):
        if isinstance(v, list):
            if not v:
                raise ValueError("lists no URL; name at least one seed node, or leave url out")
            return [_valkey_url(u) for u in v]
        return v if v is None else _valkey_url(v)

    @field_validator("streams")
    @classmethod
    def _streams(cls, v):
        if len(set(v)) != len(v):
            raise ValueError("lists a stream twice")
        return v

    @model_validator(mode="after")
    def _cluster(self):
        if isinstance(self.url, list) and len(self.url) > 1 and not self.cluster:
            raise ValueError("url: several seed URLs name a Valkey Cluster; set cluster: true")
        if self.cluster:
            # A hash tag pins keys to one slot: two streams with the same tag would share a slot, and so
            # a primary, a failover and every slot migration, which partitions are there to avoid.
            by_tag: dict[str, list[str]] = {}
            for stream in self.streams:
                by_tag.setdefault(hash_tag(stream), []).append(stream)
            shared = [names for names in by_tag.values() if len(names) > 1]
            if shared:
                raise ValueError("streams: " + "; ".join(
                    f"{', '.join(names)} share the hash tag {{{hash_tag(names[0])}}}, so one cluster slot"
                    for names in shared) + "; give each stream a hash tag of its own, or none")
        return self

    @model_validator(mode="after")
    def _tls(self):
        urls = self.seed_urls() or []
        plain = [u for u in urls if not is_tls_url(u)]
        if self.tls and plain:
            raise ValueError(f"tls: true needs valkeys:// (or rediss://) URLs; url has {plain[0]}")
        if self.tls_ca_file and not self.uses_tls():
            raise ValueError("tls_ca_file is set but the connection is plain: set tls: true, or give a "
                             "valkeys:// (or rediss://) url")
        if self.tls and self.cluster and not urls:
            raise ValueError("tls: true with cluster: true needs the cluster's valkeys:// url: the embedded "
                             "Valkey Cluster has no TLS port")
        return self

    def uses_tls(self) -> bool:
        """Whether the client speaks TLS: tls: true, or a valkeys:// (rediss://) URL."""
        return self.tls or any(is_tls_url(u) for u in self.seed_urls() or [])

    def seed_urls(self) -> list[str] | None:
        """The URLs the config names (None: the embedded server or cluster)."""
        return None if self.url is None else [self.url] if isinstance(self.url, str) else list(self.url)

    def connection_id_used(self) -> str | None:
        """The Airflow connection the credentials come from, if any."""
        return self.connection_id


class KafkaSecurity(_Model):
    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    # Username/password from an Airflow connection (login/password) or from env vars.
    connection_id: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    ssl_ca_location: str | None = None

    @model_validator(mode="after")
    def _sasl(self):
        if self.protocol.startswith("SASL") and self.sasl_mechanism is None:
            raise ValueError(f"protocol {self.protocol} needs sasl_mechanism")
        return self


class KafkaSource(_Model):
    kind: Literal["kafka"]
    # None means the embedded broker of `deltadrain services`.
    bootstrap_servers: str | None = None
    topic: str = Field(min_length=1)
    partitions: int = Field(6, ge=1, description="used when produce creates the topic")
    group: str = "deltadrain"
    security: KafkaSecurity = KafkaSecurity()
    starting_offsets: Literal["earliest", "latest"] = "earliest"
    # read_committed: a transactional producer's aborted records are never data, and an open
    # transaction's records wait for its end. read_uncommitted reads them all (Kafka's default).
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    # Where the message id comes from: the payload's id field (a payload without one is a dead letter),
    # that field or else the record's topic-partition-offset (field_or_offset), the record key or a
    # header (each falling back to topic-partition-offset when the record has none).
    id_from: Literal["field", "field_or_offset", "key", "header"] = "field"
    id_header: str | None = None
    # How an id_from: key key is written: UTF-8 text, or an Avro datum in the Confluent wire format whose
    # writer's schema the pipeline's schema registry gives (deltadrain.sources.kafka.keys).
    key_format: Literal["text", "avro"] = "text"
    on_gap: Literal["fail", "continue"] = "fail"

    @model_validator(mode="after")
    def _header(self):
        if self.id_from == "header" and not self.id_header:
            raise ValueError("id_from: header needs id_header")
        if self.key_format == "avro" and self.id_from != "key":
            raise ValueError("key_format: avro applies to id_from: key (the key is the message id)")
        return self

    def connection_id_used(self) -> str | None:
        """The Airflow connection the SASL credentials come from, if any."""
        return self.security.connection_id


# Each source's `source:` block, told apart by its `kind` (deltadrain.sources: one package per kind).
SourceSettings = Annotated[ValkeySource | KafkaSource, Field(discriminator="kind")]
SOURCE_KINDS = frozenset(get_args(m.model_fields["kind"].annotation)[0] for m in get_args(get_args(SourceSettings)[0]))


class TargetConfig(_Model):
    # Relative paths sit under the lake directory (data_dir); an s3a:// URL is a table on the object store.
    path: str
    partition_by: list[str] = []
    cluster_by: list[str] = []

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if is_s3_url(v):
            LakeUrl(v)
        return v


class SchemaConfig(_Model):
    id_field: str
    fields: dict[str, str] = Field(min_length=1)
    required: list[str] = []
    # json: each payload is a JSON object. avro: one schemaless Avro datum written with the schema in
    # avro_schema_file (deltadrain.formats.avro), optionally framed in the Confluent wire format.
    # protobuf: one serialized message of protobuf_message (deltadrain.formats.protobuf).
    format: Literal["json", "avro", "protobuf"] = "json"
    # Relative to the config file; checked against `fields` when the config is loaded.
    avro_schema_file: str | None = None
    # The wire of Avro and Protobuf bodies alike (the Confluent frame adds message indexes for Protobuf).
    avro_wire: Literal["plain", "confluent"] = "plain"
    # The schema id the Confluent-framed messages must carry; any other id is a dead letter. With a
    # registry it is optional (unset: every id the registry knows).
    avro_schema_id: int | None = Field(None, ge=0, le=2**31 - 1)
    # A Confluent-compatible schema registry (deltadrain.formats.registry): each framed message's writer schema
    # is fetched by its id. Its login comes from an Airflow connection or environment variables.
    registry_url: str | None = None
    registry_connection_id: str | None = None
    registry_username_env: str | None = None
    registry_password_env: str | None = None
    # An https registry signed by a private CA: that CA's certificates (PEM), relative to the config file.
    registry_ca_file: str | None = None
    # A serialized FileDescriptorSet (protoc --include_imports --descriptor_set_out), relative to the
    # config file, and the full name of the message each body is.
    protobuf_descriptor_file: str | None = None
    protobuf_message: str | None = None
    # add_columns: a payload field that is no column becomes a nullable one in the commit of the first
    # batch that carries it, and declared int/float fields widened to long/double widen the table's
    # column; none: fields that are not declared are ignored (docs/config.md, "Schema evolution").
    evolution: Literal["none", "add_columns"] = "none"
    # A run's evolved columns (fields the table has and the config does not declare): set by
    # deltadrain.run.layout for the run, never read from YAML.
    _evolved: frozenset = PrivateAttr(default_factory=frozenset)
    # False for a backfill or reprocess of a registry pipeline (deltadrain.run.layout.run_layout): it adds
    # and widens nothing, so its writers' new fields are not collected.
    _adding: bool = PrivateAttr(default=True)

    @property
    def evolved_columns(self) -> frozenset:
        return self._evolved

    @property
    def collects_new_fields(self) -> bool:
        """Whether decoding keeps the fields no column holds (add_columns with JSON, or with a registry):
        their types are only known from the batch (its values, or its messages' writers' schemas). With
        a schema file the new columns come from the file before the read."""
        return self.evolution == "add_columns" and (self.format == "json" or (self.registry_url is not None
                                                                              and self._adding))

    @field_validator("fields")
    @classmethod
    def _types(cls, v):
        bad = {k: t for k, t in v.items() if t.lower() not in SPARK_TYPES}
        if bad:
            raise ValueError(f"unknown types {bad}; use one of {sorted(SPARK_TYPES)}")
        # Names are quoted with backticks in Spark SQL, and deltadrain's own columns start with _dd_.
        names = [k for k in v if not k.strip() or "`" in k or k.lower().startswith("_dd_")]
        if names:
            raise ValueError(f"field names {names} are not allowed: a name must not be blank, hold a backtick "
                             "or start with _dd_ (deltadrain's own columns)")
        return {k: t.lower() for k, t in v.items()}

    @model_validator(mode="after")
    def _id_known(self):
        if self.id_field not in self.fields:
            raise ValueError(f"id_field '{self.id_field}' is not one of the fields")
        if self.fields[self.id_field] != "string":
            raise ValueError(f"id_field '{self.id_field}' must be of type string: ids are merged on their text "
                             "(integer ids in payloads are accepted and stored as text)")
        unknown = [r for r in self.required if r not in self.fields]
        if unknown:
            raise ValueError(f"required names unknown fields {unknown}")
        return self

    def registry_ca_pem(self) -> str | None:
        """The text of registry_ca_file (made absolute and checked when the config is loaded)."""
        if self.registry_ca_file is None:
            return None
        try:
            return Path(self.registry_ca_file).read_text()
        except OSError as exc:
            raise ConfigError(f"field 'schema.registry_ca_file': cannot read {self.registry_ca_file}: "
                              f"{exc.strerror or exc}") from None

    @field_validator("registry_url")
    @classmethod
    def _registry_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urllib.parse.urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL of the registry's Confluent-compatible API")
        if parts.username is not None or parts.password is not None:
            raise ValueError("carries a login; put it in an Airflow connection (registry_connection_id) or "
                             "environment variables (registry_username_env, registry_password_env)")
        if parts.query or parts.fragment:
            raise ValueError("has a query or '#' part; give the API's base URL alone")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _format(self):
        registry = self.registry_url is not None
        if self.format == "avro" and not self.avro_schema_file and not registry:
            raise ValueError("format avro needs avro_schema_file, the writer's schema (.avsc), or registry_url")
        if self.format == "protobuf" and not (self.protobuf_descriptor_file and self.protobuf_message) and not (
                registry and not self.protobuf_descriptor_file and not self.protobuf_message):
            raise ValueError("format protobuf needs protobuf_descriptor_file (a descriptor set: protoc "
                             "--include_imports --descriptor_set_out) and protobuf_message (the message's full "
                             "name), or registry_url alone")
        logins = [k for k in ("registry_connection_id", "registry_username_env", "registry_password_env")
                  if getattr(self, k) is not None]
        if logins and not registry:
            raise ValueError(f"{', '.join(logins)} only apply with registry_url")
        if self.registry_connection_id and (self.registry_username_env or self.registry_password_env):
            raise ValueError("give the registry's login either as registry_connection_id or as "
                             "registry_username_env/registry_password_env, not both")
        if self.registry_ca_file and not (self.registry_url or "").startswith("https:"):
            raise ValueError("registry_ca_file only applies to an https:// registry_url")
        if registry and (self.format == "json" or self.avro_wire != "confluent"):
            raise ValueError("registry_url needs format avro or protobuf with avro_wire: confluent (the frame "
                             "carries the schema id the registry is asked for)")
        if self.format in ("avro", "protobuf"):
            if self.avro_wire == "confluent" and self.avro_schema_id is None and not registry:
                raise ValueError("avro_wire confluent needs avro_schema_id, the id the messages carry, or registry_url")
            if self.avro_wire == "plain" and self.avro_schema_id is not None:
                raise ValueError("avro_schema_id is only read with avro_wire: confluent")
        framed = ["avro_schema_id"] * (self.avro_schema_id is not None) + ["avro_wire"] * ("avro_wire" in self.model_fields_set)
        for fmt, keys in (("avro", ["avro_schema_file"]), ("protobuf", ["protobuf_descriptor_file", "protobuf_message"]),
                          ("avro or protobuf", framed)):
            given = [k for k in keys if k in framed or getattr(self, k) is not None]
            if given and self.format not in fmt.split(" or "):
                raise ValueError(f"{', '.join(given)} only apply to format: {fmt} (this schema is {self.format})")
        return self


class Expectation(_Model):
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


class QualityConfig(_Model):
    # Empty means the default suite: id not null and unique, required columns present and typed.
    expectations: list[Expectation] = []
    on_failure: Literal["fail", "warn", "quarantine"] = "fail"


class AirflowSettings(_Model):
    """How the pipeline's DAGs run in Airflow."""

    # Intervals start here; backfills can heal any interval after it that the source still retains.
    start_date: datetime = datetime(2026, 1, 1, tzinfo=UTC)
    retries: int = Field(2, ge=0, le=20)
    retry_delay: NonNegativeDuration = timedelta(seconds=30)  # doubled on each retry (exponential backoff)
    max_retry_delay: PositiveDuration = timedelta(minutes=10)
    execution_timeout: PositiveDuration = timedelta(minutes=30)
    # How long the sensor waits for work before the run is skipped, and how often it looks.
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


class AlertSettings(_Model):
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


class PipelineConfig(_Model):
    name: str
    source: SourceSettings
    target: TargetConfig
    payload_schema: SchemaConfig = Field(alias="schema")
    transform: str | None = None
    # Messages per batch, i.e. per commit. A batch costs the Spark JVM a fixed few core-seconds of query
    # planning and JIT compiling, so a backlog drains faster with a larger cap (on 2 cores: 31 000 msg/s
    # at 200 000, 49 000 at 1 000 000; bench/batch_sizes/README.md). The driver's memory does not
    # grow with it; a larger batch is a larger unit to redeliver after a failure.
    batch_cap: int = Field(10_000, ge=1, le=10_000_000)
    max_retries: int = Field(3, ge=0, le=100)
    min_idle_ms: int = Field(60_000, ge=0)
    # The MERGE looks back this far from the batch's oldest message; a negative window would look past
    # it and insert redeliveries again.
    dedup_window: NonNegativeDuration = timedelta(days=7)
    max_message_bytes: int = Field(1_048_576, ge=64)
    quality: QualityConfig = QualityConfig()
    # A cron expression, a preset, or "@continuous": the next run starts when one ends, and its sensor
    # waits for work (docs/airflow.md, "Event-driven ingest").
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
        if getattr(self.source, "key_format", "text") == "avro" and self.payload_schema.registry_url is None:
            raise ValueError("source.key_format avro reads each key with its writer's schema from the schema "
                             "registry: set schema.registry_url")
        return self

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
        conn_ids = [self.source.connection_id_used(), self.payload_schema.registry_connection_id]
        return [c for c in conn_ids if c]

    def accepting_gaps(self) -> PipelineConfig:
        """This pipeline under on_gap: continue, for the runs an operator starts to go on past the gaps
        that stopped it (their commit records them); the config file keeps its own policy."""
        return self.model_copy(update={"source": self.source.model_copy(update={"on_gap": "continue"})})


class MaintenanceConfig(_Model):
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


class SparkSettings(_Model):
    """Where the DAGs' Spark jobs run (docs/spark-connect.md)."""

    # connect: the Airflow task is a client of a long-lived Spark Connect server (the `connect_conn_id`
    # connection; `services up` starts one). submit: each task starts a driver with spark-submit on the
    # `submit_conn_id` connection's master (YARN, Kubernetes, a standalone master, local).
    executor: Literal["connect", "submit"] = "connect"
    connect_conn_id: str = Field("spark_connect", min_length=1)
    submit_conn_id: str = Field("spark_default", min_length=1)


class DeltadrainConfig(_Model):
    data_dir: str | None = None
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
        base = Path(self.data_dir).expanduser() if self.data_dir else state_home() / "lake"
        if not base.is_absolute() and self.source_file is not None:
            base = self.source_file.parent / base
        return base.resolve()

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

    def quarantine_path(self, pipeline: PipelineConfig) -> Path | LakeUrl:
        """Where the batch checks move rows that break the pipeline's suite (`quality.quarantine.quarantine`)."""
        return self.lake_dir() / "_deltadrain" / "quarantine" / pipeline.name

    def metrics_path(self) -> Path | LakeUrl:
        """The per-run metrics table of every pipeline (deltadrain.lake.metrics)."""
        return self.lake_dir() / "_deltadrain" / "metrics"

    def quality_results_path(self) -> Path | LakeUrl:
        """The batch checks' results table of every pipeline (deltadrain.quality.results)."""
        return self.lake_dir() / "_deltadrain" / "quality" / "results"


def _where(data: dict, loc: tuple) -> tuple[str | None, str]:
    """Turn a pydantic error location into (pipeline name, dotted field)."""
    if len(loc) >= 2 and loc[0] == "pipelines" and isinstance(loc[1], int):
        entries = data.get("pipelines") or []
        entry = entries[loc[1]] if loc[1] < len(entries) else {}
        name = entry.get("name") if isinstance(entry, dict) else None
        rest = [str(x) for x in loc[2:] if x not in SOURCE_KINDS]  # pydantic names the union's member
        return (name or f"#{loc[1] + 1}"), ".".join(rest) or "(pipeline)"
    return None, ".".join(str(x) for x in loc) or "(top level)"


def parse_config(data: object, source: Path) -> DeltadrainConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with a 'pipelines' list at the top level")
    try:
        cfg = DeltadrainConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            pipeline, field = _where(data, tuple(err["loc"]))
            msg = err["msg"].removeprefix("Value error, ")
            where = f"pipeline '{pipeline}', field '{field}'" if pipeline else f"field '{field}'"
            lines.append(f"{source}: {where}: {msg}")
        raise ConfigError("\n".join(lines)) from None
    cfg = cfg.model_copy(update={"source_file": source.resolve(),
                                 "pipelines": [_with_registry_ca(_with_avro_schema(p, source), source)
                                               for p in cfg.pipelines]})
    # One table per pipeline, apart from the others and from deltadrain's own tables (DLQs, quarantine,
    # metrics): the checks, backfills, replays and VACUUMs of one would act on the other's files.
    internal = (cfg.lake_dir() / "_deltadrain").resolve()
    seen: dict[Path | LakeUrl, str] = {}
    for p in cfg.pipelines:
        path = cfg.target_path(p).resolve()
        where = f"{source}: pipeline '{p.name}', field 'target.path': {path}"
        if _overlap(path, internal):
            raise ConfigError(f"{where} overlaps deltadrain's own tables under {internal}; choose another path")
        for other, name in seen.items():
            if _overlap(path, other):
                what = "is already" if path == other else "lies inside or around"
                raise ConfigError(f"{where} {what} the target of pipeline '{name}' ({other}); "
                                  "each pipeline needs a table of its own")
        seen[path] = p.name
    return cfg


def _with_avro_schema(p: PipelineConfig, source: Path) -> PipelineConfig:
    """An Avro or Protobuf pipeline with its schema file's path made absolute, once the file is read and
    found to fill the declared fields; a ConfigError naming the file, pipeline and field otherwise."""
    from deltadrain.formats.avro import field_problems, load_schema

    schema = p.payload_schema
    if schema.format == "protobuf":
        return _with_protobuf_descriptor(p, source)
    if schema.format != "avro" or schema.avro_schema_file is None:  # None: the registry gives each writer
        return p
    path = Path(schema.avro_schema_file).expanduser()
    path = (path if path.is_absolute() else source.resolve().parent / path).resolve()
    where = f"{source}: pipeline '{p.name}', field 'schema.avro_schema_file'"
    try:
        problems = field_problems(load_schema(path), schema.fields, schema.id_field)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if problems:
        raise ConfigError(f"{where}: {path} cannot fill schema.fields: " + "; ".join(problems))
    return p.model_copy(update={"payload_schema": schema.model_copy(update={"avro_schema_file": str(path)})})


def _with_registry_ca(p: PipelineConfig, source: Path) -> PipelineConfig:
    """A pipeline with its registry's CA file made absolute, once it is found to hold certificates."""
    import ssl

    schema = p.payload_schema
    if schema.registry_ca_file is None:
        return p
    path = Path(schema.registry_ca_file).expanduser()
    path = (path if path.is_absolute() else source.resolve().parent / path).resolve()
    where = f"{source}: pipeline '{p.name}', field 'schema.registry_ca_file'"
    try:
        ssl.create_default_context(cadata=path.read_text())
    except OSError as exc:  # ssl.SSLError too
        raise ConfigError(f"{where}: {path} is not a readable PEM file of CA certificates "
                          f"({exc.strerror or exc})") from None
    except ValueError as exc:  # text without a certificate in it
        raise ConfigError(f"{where}: {path} holds no PEM certificate ({exc})") from None
    return p.model_copy(update={"payload_schema": schema.model_copy(update={"registry_ca_file": str(path)})})


def _with_protobuf_descriptor(p: PipelineConfig, source: Path) -> PipelineConfig:
    from deltadrain.formats.protobuf import field_problems, load_descriptor

    schema = p.payload_schema
    if schema.protobuf_descriptor_file is None:  # the registry gives each writer
        return p
    path = Path(schema.protobuf_descriptor_file).expanduser()
    path = (path if path.is_absolute() else source.resolve().parent / path).resolve()
    where = f"{source}: pipeline '{p.name}', field 'schema.protobuf_descriptor_file'"
    try:
        _, desc = load_descriptor(path, schema.protobuf_message)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    problems = field_problems(desc, schema.fields, schema.id_field)
    if problems:
        raise ConfigError(f"{where}: message {schema.protobuf_message} cannot fill schema.fields: "
                          + "; ".join(problems))
    return p.model_copy(update={"payload_schema": schema.model_copy(update={"protobuf_descriptor_file": str(path)})})


def _overlap(a: Path | LakeUrl, b: Path | LakeUrl) -> bool:
    if type(a) is not type(b) and (isinstance(a, LakeUrl) or isinstance(b, LakeUrl)):
        return False  # one on the object store, the other on a disk
    return a == b or a in b.parents or b in a.parents


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, except that a key given twice in one mapping is an error: YAML lets the last one
    win silently, so a second `target:` block would send a pipeline to a table nobody meant."""

    def construct_mapping(self, node, deep=False):
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            # Plain keys only, as written: merge keys (<<) may repeat, and complex keys are left to YAML.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key_node.value}' appears twice in one mapping (the second would replace "
                    "the first)", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_config(path: str | Path | None = None) -> DeltadrainConfig:
    source = Path(path) if path else config_path()
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: config file not found (set DELTADRAIN_CONFIG or pass --config)") from None
    except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, not UTF-8 text
        raise ConfigError(f"{source}: cannot read the config file: {type(exc).__name__}: {exc}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{source}:{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    return parse_config(data, source)
