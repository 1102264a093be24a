"""Reading the config: the file (`--config`, else $DELTADRAIN_CONFIG, else config/pipelines.yaml), its
YAML, the models' validation, and every error as one line naming the file, the pipeline and the field.

After validation the loader makes every path field absolute (relative to the config file:
deltadrain.config.base.resolve_path), reads the files the payload's format names (a schema that cannot
fill the declared fields, a CA file without certificates are errors here, not at the first run), and
refuses targets that overlap. Old flat `schema:` keys still load, each with one deprecation line in the
log naming its new spelling (deltadrain.config.legacy).
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml
from pydantic import ValidationError

from deltadrain.config.base import with_paths_resolved
from deltadrain.config.lakeurl import LakeUrl
from deltadrain.config.legacy import nest_schema
from deltadrain.config.models import DeltadrainConfig, PipelineConfig
from deltadrain.config.sources import SOURCE_KINDS
from deltadrain.errors import ConfigError
from deltadrain.paths import config_path

log = logging.getLogger("deltadrain.config")


def _pipeline_name(data: dict, index: int):
    """How errors name the pipeline at `index` of the YAML's list: its name, or its place."""
    entries = data.get("pipelines") or []
    entry = entries[index] if index < len(entries) else {}
    name = entry.get("name") if isinstance(entry, dict) else None
    return name or f"#{index + 1}"


def _where(data: dict, loc: tuple) -> tuple[str | None, str]:
    """Turn a pydantic error location into (pipeline name, dotted field)."""
    if len(loc) >= 2 and loc[0] == "pipelines" and isinstance(loc[1], int):
        rest = [str(x) for x in loc[2:] if x not in SOURCE_KINDS]  # pydantic names the union's member
        return _pipeline_name(data, loc[1]), ".".join(rest) or "(pipeline)"
    return None, ".".join(str(x) for x in loc) or "(top level)"


def _nested(data: dict, source: Path) -> tuple[dict, list[str]]:
    """The YAML's data with each pipeline's old flat `schema:` keys moved into their blocks (one
    deprecation line logged per key), and an error line for each key given both ways."""
    pipelines = data.get("pipelines")
    if not isinstance(pipelines, list):
        return data, []
    out, errors = [], []
    for i, entry in enumerate(pipelines):
        block = entry.get("schema") if isinstance(entry, dict) else None
        if not isinstance(block, dict):
            out.append(entry)
            continue
        nested = nest_schema(block)
        where = f"{source}: pipeline '{_pipeline_name(data, i)}', field 'schema."
        for old, new in nested.moved:
            log.warning("%s%s' is deprecated: write 'schema.%s'", where, old, new)
        errors += [f"{where}{old}' is also given as 'schema.{new}': keep 'schema.{new}' alone"
                   for old, new in nested.clashes]
        out.append({**entry, "schema": nested.block})
    return {**data, "pipelines": out}, errors


def parse_config(data: object, source: Path) -> DeltadrainConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with a 'pipelines' list at the top level")
    data, lines = _nested(data, source)
    try:
        cfg = DeltadrainConfig.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            pipeline, field = _where(data, tuple(err["loc"]))
            msg = err["msg"].removeprefix("Value error, ")
            where = f"pipeline '{pipeline}', field '{field}'" if pipeline else f"field '{field}'"
            lines.append(f"{source}: {where}: {msg}")
    if lines:
        raise ConfigError("\n".join(lines)) from None
    cfg = with_paths_resolved(cfg, source).model_copy(update={"source_file": source.resolve()})
    for p in cfg.pipelines:
        _check_files(p, source)
    _check_targets(cfg, source)
    return cfg


def _check_files(p: PipelineConfig, source: Path) -> None:
    """The files a pipeline's payload format names, read now: a ConfigError naming the file, pipeline and
    field when one is missing, is not what its field wants, or cannot fill the declared fields."""
    schema = p.payload_schema
    where = f"{source}: pipeline '{p.name}', field 'schema."
    # A format's block is given for that format alone (SchemaConfig's validation).
    if schema.avro is not None and schema.avro.schema_file is not None:  # None: the registry gives each writer
        from deltadrain.formats.avro import field_problems as avro_problems
        from deltadrain.formats.avro import load_schema

        path = schema.avro.schema_file
        try:
            problems = avro_problems(load_schema(Path(path)), schema.fields, schema.id_field)
        except ValueError as exc:
            raise ConfigError(f"{where}avro.schema_file': {exc}") from None
        if problems:
            raise ConfigError(f"{where}avro.schema_file': {path} cannot fill schema.fields: " + "; ".join(problems))
    proto = schema.protobuf
    if proto is not None and proto.descriptor_file is not None:
        from deltadrain.formats.protobuf import field_problems as protobuf_problems
        from deltadrain.formats.protobuf import load_descriptor

        assert proto.message is not None, "SchemaConfig's validation wants a message with a descriptor_file"
        try:
            _, desc = load_descriptor(Path(proto.descriptor_file), proto.message)
        except ValueError as exc:
            raise ConfigError(f"{where}protobuf.descriptor_file': {exc}") from None
        problems = protobuf_problems(desc, schema.fields, schema.id_field)
        if problems:
            raise ConfigError(f"{where}protobuf.descriptor_file': message {proto.message} cannot fill "
                              "schema.fields: " + "; ".join(problems))
    if schema.registry is not None and schema.registry.ca_file is not None:
        import ssl

        ca_file = Path(schema.registry.ca_file)
        try:
            ssl.create_default_context(cadata=ca_file.read_text())
        except OSError as exc:  # ssl.SSLError too
            raise ConfigError(f"{where}registry.ca_file': {ca_file} is not a readable PEM file of CA certificates "
                              f"({exc.strerror or exc})") from None
        except ValueError as exc:  # text without a certificate in it
            raise ConfigError(f"{where}registry.ca_file': {ca_file} holds no PEM certificate ({exc})") from None


def _check_targets(cfg: DeltadrainConfig, source: Path) -> None:
    """One table per pipeline, apart from the others and from deltadrain's own tables (DLQs, quarantine,
    metrics): the checks, backfills, replays and VACUUMs of one would act on the other's files."""
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
