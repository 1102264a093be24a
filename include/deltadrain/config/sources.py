"""The `source:` block of a pipeline: one model per kind, told apart by `kind`.

The models of what a user writes live here, in the config's layer, and what each kind does lives in its
package under deltadrain.sources (KINDS maps a kind to it). The block is a discriminated union that
pydantic needs whole when PipelineConfig is defined, and the config sits below the sources (whose code
reads it): models kept beside their sources would have the config import the sources at import time
(by importlib or otherwise), an upward edge and a cycle, since those models build on the config's base.
tests/unit/test_structure.py checks that SOURCE_KINDS and the sources' KINDS name the same kinds.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Annotated, ClassVar, Literal, get_args

from pydantic import Field, field_validator, model_validator

from deltadrain.config.base import SECRET_KEYS, ConfigPath, Model


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


class ValkeySource(Model):
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
    # The CA (PEM) the client trusts over TLS, relative to the config file; unset: the system's (the
    # embedded server's own CA for it).
    tls_ca_file: ConfigPath = None

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


class KafkaSecurity(Model):
    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    # Username/password from an Airflow connection (login/password) or from env vars.
    connection_id: str | None = None
    username_env: str | None = None
    password_env: str | None = None
    # A CA file (PEM) for SSL, relative to the config file.
    ssl_ca_location: ConfigPath = None

    @model_validator(mode="after")
    def _sasl(self):
        if self.protocol.startswith("SASL") and self.sasl_mechanism is None:
            raise ValueError(f"protocol {self.protocol} needs sasl_mechanism")
        return self


class KafkaSource(Model):
    kind: Literal["kafka"]
    # Its records carry a key beside the value (a change event's key; a tombstone is a key without a value).
    keyed_records: ClassVar[bool] = True
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
