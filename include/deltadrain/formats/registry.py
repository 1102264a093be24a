"""A schema registry client (the Confluent-compatible REST API): the writer's schema of a Confluent-framed
Avro or Protobuf message, fetched by the id in its frame (`GET /schemas/ids/{id}`) and cached per process,
since a registry never changes what an id names.

What an answer means for the batch:
- the schema: the messages of that id are decoded with it (a Protobuf schema given as `.proto` text, as
  Apicurio Registry gives it, is compiled to a descriptor first; text protoc rejects makes those messages
  `unsupported_schema` dead letters);
- an Avro schema that imports other registered schemas (references, as Apicurio Registry's Avro converter
  registers a record used in several schemas): each import is fetched by its subject and version
  (`GET /subjects/{subject}/versions/{version}`, and theirs in turn) and put in place of its first use
  (deltadrain.formats.avro.parse_writer), so the writer reads as one schema; a Protobuf schema with imports, or
  an import the registry does not have, makes the messages `unsupported_schema` dead letters;
- the id is unknown (404 with error code 40403): those messages are `unknown_schema_id` dead letters
  (bad input is data); a 404 without that code means the URL is not the API's, a run error;
- the registry cannot be reached or fails (a refused connection, a timeout, 5xx, 429): asked again with
  a backoff, then `RegistryUnavailable`, which fails the run: nothing is dead-lettered for an outage,
  nothing committed or acknowledged, and the batch waits for the next run;
- the login is refused (401, 403): `RegistryLoginRefused`, a run error naming what to fix;
- an https registry whose certificate does not verify (against the system's CAs, or the PEM of
  `schema.registry.ca_file`): `RegistryUntrusted`, a run error naming that setting; not retried.

The decoding tasks ask (the messages never pass through the driver); `Registry` travels with them
like a Valkey claim task's login (repr=False: never in a log line). Pure apart from `fetch`.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.client
import json
import re
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import NamedTuple

from deltadrain.formats.confluent import schema_id_of

ATTEMPTS = 4  # asks of one id before an outage fails the run
BACKOFF_S = 0.5  # the wait after the first failed ask, doubled after each next one
TIMEOUT_S = 10.0
MAX_ANSWER = 16 << 20  # a schema larger than this is no schema
RETRIED = {408, 425, 429, 500, 502, 503, 504}
MAX_IMPORTS = 64  # registered schemas one Avro writer may import, directly or not
# The line a failure leaves in the text of the Spark error that carries it out of a task.
MARK = "deltadrain schema registry:"


class RegistryFailure(Exception):  # a failure of the run, said in one line
    """The registry answered nothing usable for the batch: the run fails and the batch waits."""


class RegistryUnavailable(RegistryFailure):
    pass


class RegistryLoginRefused(RegistryFailure):
    pass


class RegistryUntrusted(RegistryFailure):
    pass


@dataclass(frozen=True)
class Registry:
    """Where a pipeline's registry is and how to log in (pickled with the decoding tasks)."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    login_from: str = "no login (set schema.registry.connection_id or registry.username_env/registry.password_env)"
    ca_pem: str | None = None  # the CA certificates of an https registry (schema.registry.ca_file), as text
    attempts: int = ATTEMPTS
    backoff_s: float = BACKOFF_S
    timeout_s: float = TIMEOUT_S


class Writer(NamedTuple):
    """What the registry says of one id: the schema's text (Avro: JSON; Protobuf: a serialized
    FileDescriptorProto, or `.proto` text until `fetch` compiles it), its type, and the subjects it
    imports; or, when `text` is None, why the messages of that id are dead letters (`error_type`, `error`).
    An Avro schema's imports: `pending` as the answer names them ((name, subject, version) each), `imports`
    once `fetch` got them ((full name, schema text) each, its imports' imports included)."""

    text: str | bytes | None
    schema_type: str = "AVRO"
    references: tuple = ()
    error_type: str | None = None
    error: str | None = None
    pending: tuple = ()
    imports: tuple = ()


def schema_url(base: str, schema_id: int, schema_type: str) -> str:
    """Protobuf schemas are asked for serialized (a FileDescriptorProto in base64); a registry that ignores
    the option (Apicurio) answers with `.proto` text, which `fetch` compiles."""
    url = f"{base.rstrip('/')}/schemas/ids/{int(schema_id)}"
    return url + "?format=serialized" if schema_type == "PROTOBUF" else url


def ids_of(values: list) -> dict[int, list[int]]:
    """Schema id -> the rows whose payload is framed with it (rows that are not framed are left out)."""
    out: dict[int, list[int]] = {}
    for i, value in enumerate(values):
        if value:
            found = schema_id_of(value)
            if found is not None:
                out.setdefault(found, []).append(i)
    return out


def _said(body: bytes) -> str:
    """The registry's own words in an error answer, short and on one line."""
    try:
        data = json.loads(body)
        text = str(data.get("message") or data) if isinstance(data, dict) else str(data)
    except ValueError:
        text = body.decode("utf-8", "replace")
    return " ".join(text.split())[:200]


def _code(body: bytes) -> int | None:
    """The Confluent API's `error_code` of an error answer, None when it has none."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data.get("error_code") if isinstance(data, dict) else None


def answer(status: int, body: bytes, schema_id: int, registry: Registry, wanted: str) -> Writer | None:
    """An HTTP answer to `GET /schemas/ids/{schema_id}` -> the writer (or the dead letter of its messages);
    None when the ask is worth repeating (5xx, 429, a timeout's 408). Raises RegistryLoginRefused on 401/403
    and RegistryUnavailable on an answer no retry changes (another 4xx, a 404 without error code 40403,
    a body that is no schema)."""
    where = f"the schema registry at {registry.url}"
    if status == 200:
        try:
            data = json.loads(body)
            text = data["schema"]
        except (ValueError, KeyError, TypeError):
            raise RegistryUnavailable(f"{MARK} {where} answered schema id {schema_id} with no schema "
                                      f"({_said(body)}): is schema.registry.url a Confluent-compatible API?") from None
        kind = (data.get("schemaType") or "AVRO").upper()
        refs = tuple(sorted(f"{r.get('subject')} v{r.get('version')}" if isinstance(r, dict) else str(r)
                            for r in data.get("references") or ()))
        if kind != wanted:
            return Writer(None, kind, refs, "unsupported_schema",
                          f"schema id {schema_id} is a {kind} schema in {where}; this pipeline reads {wanted.lower()}")
        if refs and kind == "AVRO":
            return Writer(text, kind, refs, pending=_named_refs(data.get("references")))
        if refs:
            return Writer(None, kind, refs, "unsupported_schema",
                          f"schema id {schema_id} imports other registered schemas ({', '.join(refs)}), "
                          f"which deltadrain does not resolve")
        if kind == "PROTOBUF":
            # Not base64: `.proto` text (Apicurio's answer, whatever ?format says), which `fetch` compiles.
            with contextlib.suppress(ValueError):
                text = base64.b64decode(text, validate=True)
        return Writer(text, kind)
    if status == 404 and _code(body) == 40403:
        return Writer(None, wanted, (), "unknown_schema_id",
                      f"unknown schema id {schema_id} ({where} does not know it: {_said(body)})")
    if status == 404:  # no "schema not found" code: the URL is not the API's, and no message is to blame
        raise RegistryUnavailable(f"{MARK} {where} answered HTTP 404 without error code 40403 for schema id "
                                  f"{schema_id} ({_said(body)}): is schema.registry.url the base of a "
                                  f"Confluent-compatible API (for Apicurio Registry, .../apis/ccompat/v7)?")
    if status in (401, 403):
        what = "refused the login" if status == 401 else "denied reading schemas"
        raise RegistryLoginRefused(f"{MARK} {where} {what} (HTTP {status}: {_said(body)}): check the login "
                                   f"in {registry.login_from}")
    if status in RETRIED:
        return None
    raise RegistryUnavailable(f"{MARK} {where} answered HTTP {status} for schema id {schema_id} ({_said(body)})")


def _ask(url: str, registry: Registry, body: dict | None = None) -> tuple[int, bytes]:
    """GET `url` (POST `body` as JSON when given) with the registry's login and trust."""
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.schemaregistry.v1+json, "
                                                             "application/json"})
    if body is not None:
        request.data = json.dumps(body).encode()
        request.add_header("Content-Type", "application/vnd.schemaregistry.v1+json")
    if registry.username is not None or registry.password is not None:
        login = f"{registry.username or ''}:{registry.password or ''}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(login).decode())
    context = tls_context(registry.ca_pem) if registry.url.startswith("https:") else None
    try:
        with urllib.request.urlopen(request, timeout=registry.timeout_s, context=context) as reply:  # http(s) only (config)
            return reply.status, reply.read(MAX_ANSWER)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(MAX_ANSWER) if exc.fp else b""


@functools.lru_cache(maxsize=8)
def tls_context(ca_pem: str | None) -> ssl.SSLContext:
    """The context an https registry is verified with: the system's CAs, or only those of
    `schema.registry.ca_file` when it is set (a private CA). Host names are checked either way."""
    return ssl.create_default_context(cadata=ca_pem) if ca_pem else ssl.create_default_context()


def untrusted(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate failure inside a failed ask (urllib wraps it in URLError), None for other errors."""
    reason = getattr(exc, "reason", exc)
    return reason if isinstance(reason, ssl.SSLCertVerificationError) else None


def _named_refs(refs) -> tuple:
    """An answer's `references` -> ((name, subject, version), ...)."""
    return tuple((str(r.get("name")), str(r.get("subject")), r.get("version")) for r in refs or ()
                 if isinstance(r, dict))


def fetch(registry: Registry, schema_id: int, schema_type: str, *, sleep=time.sleep, ask=_ask) -> Writer:
    """The writer of `schema_id` (with an Avro schema's imports), asking again with a doubling backoff while
    the registry is out; RegistryUnavailable with the last reason when it stays out."""
    found = _retrying(registry, schema_url(registry.url, schema_id, schema_type),
                      lambda status, body: answer(status, body, schema_id, registry, schema_type),
                      f"schema id {schema_id}", sleep=sleep, ask=ask)
    if found.schema_type == "PROTOBUF" and isinstance(found.text, str):
        return compiled(found, schema_id)
    return _imported(registry, found, schema_id, sleep=sleep, ask=ask) if found.pending else found


def _imported(registry: Registry, found: Writer, schema_id: int, *, sleep, ask) -> Writer:
    """An Avro writer with its imports fetched (each subject version once), or the dead letter of its messages
    when the registry does not have one of them."""
    imports: dict[str, str] = {}
    todo = list(found.pending)
    while todo:
        name, subject, version = todo.pop(0)
        if name in imports:
            continue
        if len(imports) >= MAX_IMPORTS:
            return Writer(None, "AVRO", found.references, "unsupported_schema",
                          f"schema id {schema_id} imports more than {MAX_IMPORTS} registered schemas")
        url = f"{registry.url}/subjects/{urllib.parse.quote(subject, safe='')}/versions/{version}"
        ref = f"{subject} v{version}"
        what = f"{ref} (imported by schema id {schema_id})"

        def judge(status: int, body: bytes, ref=ref, what=what):
            if status == 404:
                return Writer(None, "AVRO", found.references, "unsupported_schema",
                              f"schema id {schema_id} imports {ref}, which the schema registry at "
                              f"{registry.url} does not have ({_said(body)})")
            return answer(status, body, schema_id, registry, "AVRO") if status != 200 else _version(body, what,
                                                                                                     registry)

        got = _retrying(registry, url, judge, what, sleep=sleep, ask=ask)
        if got.text is None:
            return got
        imports[name] = str(got.text)
        todo.extend(got.pending)
    return found._replace(pending=(), imports=tuple(imports.items()))


def _version(body: bytes, what: str, registry: Registry) -> Writer:
    """`GET /subjects/{subject}/versions/{version}`'s answer -> its schema text and the schemas it imports."""
    try:
        data = json.loads(body)
        return Writer(data["schema"], "AVRO", pending=_named_refs(data.get("references")))
    except (ValueError, KeyError, TypeError):
        raise RegistryUnavailable(f"{MARK} the schema registry at {registry.url} answered {what} with no schema "
                                  f"({_said(body)})") from None


def _retrying(registry: Registry, url: str, judge, what: str, *, sleep, ask) -> Writer:
    """`judge(status, body)` of the answer to `url`, asked again with a doubling backoff while the registry is
    out or `judge` says None (an answer worth repeating); RegistryUnavailable with the last reason."""
    why = ""
    for attempt in range(registry.attempts):
        if attempt:
            sleep(registry.backoff_s * 2 ** (attempt - 1))
        try:
            status, body = ask(url, registry)
        except (OSError, ValueError, http.client.HTTPException) as exc:  # refused, reset, timed out, cut short
            if (bad := untrusted(exc)) is not None:  # no retry makes a certificate trusted
                fix = ("is schema.registry.ca_file the CA that signed it?" if registry.ca_pem else
                       "set schema.registry.ca_file to the CA that signed it (a PEM file)")
                raise RegistryUntrusted(f"{MARK} the schema registry at {registry.url} presents a certificate "
                                        f"this client does not trust ({bad.verify_message or bad}): {fix}") from None
            reason = getattr(exc, "reason", exc)
            why = f"{type(reason).__name__}: {' '.join(str(reason).split())[:200]}"
            continue
        found = judge(status, body)
        if found is not None:
            return found
        why = f"HTTP {status}: {_said(body)}"
    raise RegistryUnavailable(f"{MARK} cannot get {what} from the schema registry at {registry.url} "
                              f"after {registry.attempts} attempts ({why}); nothing of the batch was committed or "
                              f"acknowledged: it is read again once the registry answers")


def register(registry: Registry, subject: str, schema: str, schema_type: str = "AVRO") -> int:
    """Register `schema` under `subject` as a producer's serializer does (`POST /subjects/{subject}/versions`)
    and return its id: the one it already has when the subject holds it. For `deltadrain produce`; a
    drain never writes to the registry."""
    url = f"{registry.url}/subjects/{urllib.parse.quote(subject, safe='')}/versions"
    body = {"schema": schema, **({"schemaType": schema_type} if schema_type != "AVRO" else {})}
    try:
        status, answer_body = _ask(url, registry, body)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise RegistryUnavailable(f"{MARK} cannot register a schema under '{subject}' at {registry.url} "
                                  f"({type(exc).__name__}: {exc})") from None
    if status in (401, 403):
        raise RegistryLoginRefused(f"{MARK} the schema registry at {registry.url} refused to register under "
                                   f"'{subject}' (HTTP {status}): check the login in {registry.login_from}")
    try:
        if status == 200:
            return int(json.loads(answer_body)["id"])
    except (ValueError, KeyError, TypeError):
        pass
    raise RegistryUnavailable(f"{MARK} the schema registry at {registry.url} did not register the schema under "
                              f"'{subject}' (HTTP {status}: {_said(answer_body)})")


def compiled(found: Writer, schema_id: int) -> Writer:
    """A Protobuf writer given as `.proto` text -> its serialized FileDescriptorProto; text protoc rejects
    makes the messages of that id `unsupported_schema` dead letters (the schema, not the batch, is bad);
    protoc that cannot run here fails the run instead, as an outage does: no message is to blame."""
    import subprocess

    from deltadrain.formats.proto_source import compile_proto

    if not isinstance(found.text, str):  # already a descriptor, or a dead letter's writer
        return found
    try:
        done = compile_proto(found.text, f"schema_{schema_id}.proto")
    except (OSError, subprocess.SubprocessError) as exc:
        raise RegistryUnavailable(f"{MARK} cannot compile the .proto text of schema id {schema_id} with "
                                  f"grpcio-tools' protoc ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); "
                                  f"is grpcio-tools installed (make install)?") from None
    if done.data is None:
        return Writer(None, found.schema_type, found.references, "unsupported_schema",
                      f"schema id {schema_id} is Protobuf text that protoc rejects: {done.error}")
    return found._replace(text=done.data)


# Ids never change what they name: a writer found is kept for the process's life (the executors' Python
# workers are reused across tasks and runs). Dead letters are not kept: an id unknown now may be
# registered (restored) later, so each batch asks again, once.
_CACHE: dict[tuple[str, str, int], Writer] = {}
_LOCK = threading.Lock()


def writer(registry: Registry, schema_id: int, schema_type: str, *, fetcher=fetch) -> Writer:
    key = (registry.url, schema_type, schema_id)
    with _LOCK:
        found = _CACHE.get(key)
    if found is not None:
        return found
    found = fetcher(registry, schema_id, schema_type)
    if found.text is not None:
        with _LOCK:
            _CACHE[key] = found
    return found


def failure_line(exc: BaseException) -> str | None:
    """A registry failure that ended a run, as its one line (also when a Spark error carries it out of a
    task, inside a Python traceback); None for other errors."""
    link: BaseException | None = exc
    for _ in range(10):
        if link is None:
            return None
        if isinstance(link, RegistryFailure):
            return str(link)
        match = re.search(re.escape(MARK) + r"[^\n]*", str(link))
        if match:
            return match.group(0).rstrip()
        link = link.__cause__ or link.__context__
    return None


def registry_of(schema_config) -> Registry | None:
    """The registry of a pipeline's `schema:` block with its login (None without `registry:`). Read
    where the decoding tasks are planned; a login that is configured but missing is a ConfigError that
    names the connection or variable."""
    import os

    from deltadrain.errors import ConfigError
    from deltadrain.secrets import credentials, env_name

    settings = schema_config.registry
    if settings is None:
        return None
    url, ca = settings.url, settings.ca_pem()
    if settings.connection_id:
        conn = settings.connection_id
        creds = credentials(connection_id=conn)
        return Registry(url, creds.username, creds.password,
                        f"the Airflow connection '{conn}' (or {env_name(conn)}), schema.registry.connection_id", ca_pem=ca)
    user_env, password_env = settings.username_env, settings.password_env
    if not (user_env or password_env):
        return Registry(url, ca_pem=ca)
    named = [n for n in (user_env, password_env) if n]
    missing = [n for n in named if os.environ.get(n) is None]
    if missing:
        raise ConfigError(f"environment variable {' and '.join(missing)} (schema.registry.username_env/"
                          f"password_env) is not set: the login of the schema registry at {url}")
    return Registry(url, os.environ.get(user_env) if user_env else None,
                    os.environ.get(password_env) if password_env else None,
                    f"the environment variables {' and '.join(named)} (schema.registry.username_env/"
                    f"password_env)", ca_pem=ca)
