"""The `schema:` block of a pipeline: the declared fields, the payload's format, and each format's settings
in a block named for what it governs: `avro:` (the writer's schema file, the wire, the schema id),
`protobuf:` (the descriptor set and message, the wire, the schema id) and `registry:` (a
Confluent-compatible schema registry and its login). The flat keys of older configs (`avro_wire`,
`registry_url`, ...) are moved into these blocks by the loader (deltadrain.config.legacy).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from deltadrain.config.base import SPARK_TYPES, ConfigPath, Model
from deltadrain.errors import ConfigError


class Framing(Model):
    """How an Avro or Protobuf body travels: alone, or in the Confluent wire format's frame."""

    # plain: the body alone. confluent: magic byte 0, a 4-byte big-endian schema id (for Protobuf then the
    # message indexes), then the body.
    wire: Literal["plain", "confluent"] = "plain"
    # The schema id the Confluent-framed messages must carry; any other id is a dead letter. With a
    # registry it is optional (unset: every id the registry knows).
    schema_id: int | None = Field(None, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _framed(self):
        if self.wire == "plain" and self.schema_id is not None:
            raise ValueError("schema_id is only read with wire: confluent")
        return self


class AvroSettings(Framing):
    """`schema.avro`: one schemaless Avro datum per body (deltadrain.formats.avro)."""

    # The writer's schema (.avsc), relative to the config file; checked against `fields` when the config
    # is loaded. Optional with a registry, which gives each message's writer.
    schema_file: ConfigPath = None


class ProtobufSettings(Framing):
    """`schema.protobuf`: one serialized message per body (deltadrain.formats.protobuf)."""

    # A serialized FileDescriptorSet (protoc --include_imports --descriptor_set_out), relative to the
    # config file, and the full name of the message each body is. Both, or neither with a registry.
    descriptor_file: ConfigPath = None
    message: str | None = None


class RegistrySettings(Model):
    """`schema.registry`: a Confluent-compatible schema registry (deltadrain.formats.registry); each framed
    message's writer schema is fetched by its id. Its login comes from an Airflow connection or
    environment variables."""

    url: str
    connection_id: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    # An https registry signed by a private CA: that CA's certificates (PEM), relative to the config file.
    ca_file: ConfigPath = None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urllib.parse.urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL of the registry's Confluent-compatible API")
        if parts.username is not None or parts.password is not None:
            raise ValueError("carries a login; put it in an Airflow connection (registry.connection_id) or "
                             "environment variables (registry.username_env, registry.password_env)")
        if parts.query or parts.fragment:
            raise ValueError("has a query or '#' part; give the API's base URL alone")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _login(self):
        if self.connection_id and (self.username_env or self.password_env):
            raise ValueError("give the registry's login either as connection_id or as username_env/password_env, "
                             "not both")
        if self.ca_file and not self.url.startswith("https:"):
            raise ValueError("ca_file only applies to an https:// url")
        return self

    def ca_pem(self) -> str | None:
        """The text of ca_file (made absolute and checked when the config is loaded)."""
        if self.ca_file is None:
            return None
        try:
            return Path(self.ca_file).read_text()
        except OSError as exc:
            raise ConfigError(f"field 'schema.registry.ca_file': cannot read {self.ca_file}: "
                              f"{exc.strerror or exc}") from None


class SchemaConfig(Model):
    # The message id (insert mode's MERGE key); upsert mode (target.mode) takes none: the key is target.key.
    id_field: str = ""
    fields: dict[str, str] = Field(min_length=1)
    required: list[str] = []
    # json: each payload is a JSON object. avro: one schemaless Avro datum (the `avro:` block). protobuf:
    # one serialized message (the `protobuf:` block).
    format: Literal["json", "avro", "protobuf"] = "json"
    avro: AvroSettings | None = None
    protobuf: ProtobufSettings | None = None
    registry: RegistrySettings | None = None
    # add_columns: a payload field that is no column becomes a nullable one in the commit of the first
    # batch that carries it, and declared int/float fields widened to long/double widen the table's
    # column; none: fields that are not declared are ignored (docs/config.md, "Schema evolution").
    evolution: Literal["none", "add_columns"] = "none"
    # debezium: each payload is a Debezium change event (before/after/op/source), read in upsert mode
    # (docs/cdc.md): JSON, or Avro through the registry (key and value); none: the payload is the row itself.
    envelope: Literal["none", "debezium"] = "none"
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
        return self.evolution == "add_columns" and (self.format == "json" or (self.registry is not None
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
        if not self.id_field:  # upsert mode (PipelineConfig checks that it is)
            pass
        elif self.id_field not in self.fields:
            raise ValueError(f"id_field '{self.id_field}' is not one of the fields")
        elif self.fields[self.id_field] != "string":
            raise ValueError(f"id_field '{self.id_field}' must be of type string: ids are merged on their text "
                             "(integer ids in payloads are accepted and stored as text)")
        unknown = [r for r in self.required if r not in self.fields]
        if unknown:
            raise ValueError(f"required names unknown fields {unknown}")
        return self

    @model_validator(mode="after")
    def _format(self):
        for name in ("avro", "protobuf"):
            if getattr(self, name) is not None and self.format != name:
                raise ValueError(f"{name} applies to format: {name} only (this schema is {self.format})")
        registry = self.registry is not None
        if self.envelope == "debezium" and self.format == "protobuf":
            raise ValueError("envelope debezium reads JSON change events, or Avro ones through registry.url; "
                             "Protobuf change events are not read: set format: json or avro")
        if self.envelope == "debezium" and self.format == "avro" and not registry:
            raise ValueError("envelope debezium with format avro reads each change with its writer's schema from the "
                             "schema registry (Debezium's Avro converter registers one per table), not from "
                             "avro.schema_file: set registry.url")
        if self.envelope == "debezium" and self.avro is not None and (self.avro.schema_file or
                                                                      self.avro.schema_id is not None):
            raise ValueError("envelope debezium reads each record's key and value with the writer's schema its id "
                             "names in the registry: leave avro.schema_file and avro.schema_id out")
        if self.format == "json":
            if registry:
                raise ValueError("registry applies to format: avro or protobuf only (this schema is json)")
            return self
        if self.format == "avro" and not (self.avro and self.avro.schema_file) and not registry:
            raise ValueError("format avro needs avro.schema_file, the writer's schema (.avsc), or registry.url")
        if self.format == "protobuf":
            given = (self.protobuf is not None and self.protobuf.descriptor_file is not None,
                     self.protobuf is not None and self.protobuf.message is not None)
            if given != (True, True) and not (registry and given == (False, False)):
                raise ValueError("format protobuf needs protobuf.descriptor_file (a descriptor set: protoc "
                                 "--include_imports --descriptor_set_out) and protobuf.message (the message's full "
                                 "name), or registry.url alone")
        framing = (self.avro if self.format == "avro" else self.protobuf) or Framing()
        if registry and framing.wire != "confluent":
            raise ValueError(f"registry needs {self.format}.wire: confluent (the frame carries the schema id the "
                             "registry is asked for)")
        if framing.wire == "confluent" and framing.schema_id is None and not registry:
            raise ValueError(f"{self.format}.wire confluent needs {self.format}.schema_id, the id the messages carry, "
                             "or registry.url")
        return self
