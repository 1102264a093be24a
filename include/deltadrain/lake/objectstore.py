"""Where a lake on S3 (or an S3-compatible store) is reached and with which login, and how each of
deltadrain's three clients is told: Spark through hadoop-aws (`spark_conf`), delta-rs
(`storage_options`) and pyarrow (`pyarrow_filesystem`). Pure but for reading the environment and
Airflow's connections: the endpoint and the login never come from the YAML.

Where they come from, first found wins (docs/object-store.md):
1. the Airflow connection `deltadrain_s3` (type aws: login = access key id, password = secret,
   extra `endpoint_url` and `region_name`), from AIRFLOW_CONN_DELTADRAIN_S3 or Airflow's store;
2. DELTADRAIN_S3_ACCESS_KEY_ID, DELTADRAIN_S3_SECRET_ACCESS_KEY, DELTADRAIN_S3_ENDPOINT_URL,
   DELTADRAIN_S3_REGION;
3. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION (AWS's own names);
4. the embedded S3 server's login file, once `deltadrain services up --only s3` made it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from deltadrain.config.lakeurl import LakeUrl, bucket_and_key, is_s3_url  # noqa: F401 (this module's names too)
from deltadrain.errors import ConfigError
from deltadrain.paths import command_line
from deltadrain.secrets import stored_connection

CONNECTION_ID = "deltadrain_s3"
# Built from jvm/s3logstore into the s3a kind of the jar cache: the log store of lakes on S3 (conditional PUT).
S3_LOG_STORE_CLASS = "dev.deltadrain.storage.S3ConditionalLogStore"
DEFAULT_REGION = "us-east-1"
# hadoop-aws's providers, in order: the login in the session's conf (fs.s3a.access.key/secret.key), then
# AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY in the driver's environment (what spark-submit should use:
# a secret on its command line is visible to every user of the machine).
CREDENTIALS_PROVIDERS = ("org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider,"
                         "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider")


@dataclass(frozen=True)
class S3Settings:
    """An S3 endpoint and the login for it. `endpoint_url` None means AWS's own endpoints."""

    access_key_id: str
    secret_access_key: str = field(repr=False)  # never in a log line
    endpoint_url: str | None = None
    region: str = DEFAULT_REGION
    source: str = ""  # where these came from, for error messages

    def __post_init__(self):
        if self.endpoint_url is not None:
            parts = urlsplit(self.endpoint_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"S3 endpoint {self.endpoint_url!r} ({self.source}): use http(s)://host[:port]")
            if parts.username or parts.password:
                raise ConfigError(f"S3 endpoint ({self.source}) carries a login; put it in the connection's "
                                  "login and password or the environment")

    @property
    def secure(self) -> bool:
        return self.endpoint_url is None or urlsplit(self.endpoint_url).scheme == "https"


def from_connection(conn: Mapping, source: str) -> S3Settings:
    """An Airflow connection of type aws, as the dict AIRFLOW_CONN_<ID> holds in JSON."""
    extra = conn.get("extra") or {}
    if isinstance(extra, str):
        extra = json.loads(extra) if extra.strip() else {}
    key = conn.get("login") or extra.get("aws_access_key_id")
    secret = conn.get("password") or extra.get("aws_secret_access_key")
    if not key or not secret:
        raise ConfigError(f"{source} has no access key id and secret (its login and password)")
    endpoint = extra.get("endpoint_url") or (extra.get("service_config") or {}).get("s3", {}).get("endpoint_url")
    return S3Settings(key, secret, endpoint or None, extra.get("region_name") or DEFAULT_REGION, source)


def from_env(env: Mapping[str, str], prefix: str) -> S3Settings | None:
    """`<prefix>ACCESS_KEY_ID` and the rest; None when neither the key nor the secret is set."""
    key, secret = env.get(f"{prefix}ACCESS_KEY_ID"), env.get(f"{prefix}SECRET_ACCESS_KEY")
    if not key and not secret:
        return None
    if not key or not secret:
        missing = f"{prefix}ACCESS_KEY_ID" if not key else f"{prefix}SECRET_ACCESS_KEY"
        raise ConfigError(f"{missing} is not set (the object store's login needs both the key and the secret)")
    region = env.get(f"{prefix}REGION") or (env.get("AWS_DEFAULT_REGION") if prefix == "AWS_" else None)
    return S3Settings(key, secret, env.get(f"{prefix}ENDPOINT_URL") or None, region or DEFAULT_REGION,
                      f"the environment ({prefix}*)")


def resolve(env: Mapping[str, str] | None = None, *, connection_id: str = CONNECTION_ID,
            lookup: Callable[[str], Mapping | None] = stored_connection,
            embedded: Callable[[], dict | None] | None = None) -> S3Settings:
    """The object store's settings from the first place that has them (the module's docstring)."""
    env = os.environ if env is None else env
    var = f"AIRFLOW_CONN_{connection_id.upper()}"
    if raw := env.get(var):
        if not raw.lstrip().startswith("{"):
            raise ConfigError(f"{var}: give the connection as JSON (conn_type aws, login, password, extra)")
        return from_connection(json.loads(raw), f"{var}")
    found = lookup(connection_id)
    if found is not None:
        return from_connection(found, f"Airflow connection '{connection_id}'")
    for prefix in ("DELTADRAIN_S3_", "AWS_"):
        if (settings := from_env(env, prefix)) is not None:
            return settings
    if embedded is not None and (conn := embedded()) is not None:
        return from_connection(conn, "the embedded S3 server")
    raise ConfigError(f"no object store login: create the Airflow connection '{connection_id}' (type aws, "
                      f"endpoint_url in its extra), or set {var}, DELTADRAIN_S3_ACCESS_KEY_ID and "
                      "DELTADRAIN_S3_SECRET_ACCESS_KEY (and _ENDPOINT_URL), or start the embedded server with "
                      f"`{command_line('services up --only s3')}`")


def embedded_connection() -> dict | None:
    """The embedded S3 server's connection, when its login file exists (`services up --only s3`)."""
    from deltadrain.config import load_config
    from deltadrain.config.embedded import s3_connection

    return s3_connection(load_config())


def spark_conf(s: S3Settings, *, with_login: bool = True) -> dict[str, str]:
    """hadoop-aws's settings for s3a:// paths, as Spark confs, and deltadrain's S3 log store for Delta.
    Without the login, the driver must find it in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (`driver_env`)."""

    conf = {
        "spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
        "spark.hadoop.fs.s3a.aws.credentials.provider": CREDENTIALS_PROVIDERS,
        "spark.hadoop.fs.s3a.endpoint.region": s.region,
        # Commits are put only if absent (If-None-Match: *): deltadrain's log store asks for it per file.
        "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
        "spark.delta.logStore.s3a.impl": S3_LOG_STORE_CLASS,
    }
    if s.endpoint_url is not None:
        conf.update({
            "spark.hadoop.fs.s3a.endpoint": s.endpoint_url,
            # An S3-compatible server on one host name has no bucket sub-domains.
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(s.secure).lower(),
        })
    if with_login:
        conf["spark.hadoop.fs.s3a.access.key"] = s.access_key_id
        conf["spark.hadoop.fs.s3a.secret.key"] = s.secret_access_key
    return conf


def driver_env(s: S3Settings) -> dict[str, str]:
    """The login as the environment variables hadoop-aws's second provider reads (for spark-submit)."""
    return {"AWS_ACCESS_KEY_ID": s.access_key_id, "AWS_SECRET_ACCESS_KEY": s.secret_access_key}


def storage_options(s: S3Settings) -> dict[str, str]:
    """delta-rs's (object_store's) options for s3:// and s3a:// table URIs."""
    opts = {"AWS_ACCESS_KEY_ID": s.access_key_id, "AWS_SECRET_ACCESS_KEY": s.secret_access_key,
            "AWS_REGION": s.region,
            # Should delta-rs ever write: put a commit only if absent, as the Spark log store does.
            "AWS_CONDITIONAL_PUT": "etag"}
    if s.endpoint_url is not None:
        opts["AWS_ENDPOINT_URL"] = s.endpoint_url
        opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
        if not s.secure:
            opts["AWS_ALLOW_HTTP"] = "true"
    return opts


def pyarrow_filesystem(s: S3Settings):
    """A pyarrow S3FileSystem on the same store with the same login (paths: bucket/key, no scheme)."""
    from pyarrow import fs

    kwargs = {}
    if s.endpoint_url is not None:
        parts = urlsplit(s.endpoint_url)
        kwargs = {"endpoint_override": parts.netloc + parts.path.rstrip("/"), "scheme": parts.scheme,
                  "force_virtual_addressing": False}
    return fs.S3FileSystem(access_key=s.access_key_id, secret_key=s.secret_access_key, region=s.region, **kwargs)


def settings_for(path) -> S3Settings | None:
    """The store's settings when `path` (a table's, the lake's, a staging directory's) is on it, else
    None: the one place the readers and writers ask, so that each gets the same login."""
    if not is_s3_url(path):
        return None
    return _settings(tuple((k, v) for k, v in sorted(os.environ.items()) if k.startswith(_WHERE_FROM)))


# What `resolve` reads from the environment (with the embedded server's port and home): a change to any
# of them is a new lookup; otherwise a process asks Airflow and reads the login file once.
_WHERE_FROM = ("AIRFLOW_CONN_DELTADRAIN_S3", "DELTADRAIN_S3_", "AWS_", "DELTADRAIN_HOME", "DELTADRAIN_CONFIG",
               "AIRFLOW_HOME")


@functools.lru_cache(maxsize=4)
def _settings(env: tuple[tuple[str, str], ...]) -> S3Settings:
    return resolve(dict(env), embedded=embedded_connection)


def table_options(path) -> dict[str, str] | None:
    """delta-rs's storage_options for the table at `path`: None for a local one."""
    s = settings_for(path)
    return storage_options(s) if s is not None else None


def store_settings(url) -> S3Settings:
    """The store's settings for `url`, which must be on it."""
    if (s := settings_for(url)) is None:
        raise ValueError(f"{url} is not on the object store")
    return s


def remove_tree(url) -> None:
    """Delete every object under `url` (a run's staging): nothing there is no error."""
    fs = pyarrow_filesystem(store_settings(url))
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(LakeUrl(str(url)).fs_path())


def sweep_abandoned(root, before: float) -> list[str]:
    """The object-store twin of paths.sweep_abandoned: delete the run directories under `root` in which
    no object is newer than `before` (epoch seconds)."""
    from pyarrow import fs as pafs

    store = pyarrow_filesystem(store_settings(root))
    base = LakeUrl(str(root)).fs_path()
    newest: dict[str, float] = {}
    for info in store.get_file_info(pafs.FileSelector(base, allow_not_found=True, recursive=True)):
        if info.type != pafs.FileType.File or info.mtime is None:
            continue
        run = info.path[len(base) + 1:].split("/", 1)[0]
        newest[run] = max(newest.get(run, 0.0), info.mtime.timestamp())
    removed = []
    for run, when in sorted(newest.items()):
        if when < before:
            store.delete_dir(f"{base}/{run}")
            removed.append(run)
    return removed


def for_config(cfg) -> S3Settings | None:
    """The store's settings when the config's lake (or a target table) is on it, else None."""
    if not cfg.on_object_store:
        return None
    return settings_for("s3a://lake")


def login_conf(s: S3Settings) -> dict[str, str]:
    """The login as hadoop-aws's Spark confs (for a properties file: `private_properties`)."""
    return {"spark.hadoop.fs.s3a.access.key": s.access_key_id, "spark.hadoop.fs.s3a.secret.key": s.secret_access_key}


def private_properties(conf: dict[str, str], path: Path) -> Path:
    """Secret Spark confs as a properties file (spark-submit's --properties-file), made anew and readable
    by its owner only from the start. spark-submit puts it in the application's conf, so executors on
    other machines get it with the rest; on its command line every user of the machine would read it."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.writelines(f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in conf.items())
    return path


def as_connection(s: S3Settings) -> str:
    """The settings as AIRFLOW_CONN_DELTADRAIN_S3's JSON (type aws), for a job's environment: a driver
    started by spark-submit cannot ask Airflow's metadata DB (secrets.handed_over)."""
    extra = {"region_name": s.region, **({"endpoint_url": s.endpoint_url} if s.endpoint_url else {})}
    return json.dumps({"conn_type": "aws", "login": s.access_key_id, "password": s.secret_access_key,
                       "extra": extra})


def objects_under(url, suffix: str, skip: str | None = None) -> int:
    """How many objects under `url` end in `suffix`, leaving out any under a folder named `skip`."""
    from pyarrow import fs as pafs

    store = pyarrow_filesystem(store_settings(url))
    found = store.get_file_info(pafs.FileSelector(LakeUrl(str(url)).fs_path(), allow_not_found=True, recursive=True))
    return sum(1 for info in found if info.type == pafs.FileType.File and info.path.endswith(suffix)
               and (skip is None or f"/{skip}/" not in info.path))
