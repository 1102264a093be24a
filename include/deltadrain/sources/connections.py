"""A failure to reach a pipeline's source, as one line that names the service, its address and the fix."""

from __future__ import annotations

from deltadrain.config import DeltadrainConfig, PipelineConfig
from deltadrain.paths import command_line
from deltadrain.sources import Source, SuggestsGrants, all_sources


def _failure(exc: BaseException) -> tuple[Source, str, str] | None:
    """(the source, the kind of failure, the reason) when exc or one of its causes is a failure to
    reach or log in to a source's server, or a command its ACL denies (Source.connection_failure)."""
    link: BaseException | None = exc
    for _ in range(10):
        if link is None:
            return None
        for source in all_sources():
            found = source.connection_failure(link)
            if found is not None:
                return source, *found
        link = link.__cause__ or link.__context__
    return None


def unreachable_source(exc: BaseException, cfg: DeltadrainConfig, pipelines: list[PipelineConfig],
                       with_reason: bool = True) -> str | None:
    """A connection failure to the Valkey or Kafka of `pipelines` as one line that names the service,
    its address and the fix; None when exc is no such failure. `with_reason`: with what the client
    said (the view leaves it out: it may name other hosts)."""
    found = unreachable(exc, cfg, pipelines, with_reason)
    return found[1] if found is not None else None


def unreachable(exc: BaseException, cfg: DeltadrainConfig, pipelines: list[PipelineConfig],
                with_reason: bool = True) -> tuple[str, str] | None:
    """("unreachable", "login_refused" or "denied", unreachable_source's line), or None when exc is no
    failure to reach or log in to a source's server, nor a command its ACL denies."""
    found = _failure(exc)
    if found is None:
        return None
    source, failure, reason = found
    kind, service, field = source.kind, source.service, source.address_field
    ours = [p for p in pipelines if p.source.kind == kind] or [p for p in cfg.pipelines if p.source.kind == kind]
    where = ", ".join(sorted({source.address(cfg, p) for p in ours})) or "(no such pipeline)"
    names = ", ".join(f"'{p.name}'" for p in ours)
    said = f" ({' '.join(reason.split())[:300]})" if with_reason else f" ({type(exc).__name__})"
    if failure == "denied":
        grants = sorted({g for p in ours if isinstance(source, SuggestsGrants) and (g := source.acl_to_add(p, reason))})
        grant = f"add the ACL ({'; '.join(grants)}) for" if grants else "grant it to"
        return "denied", (
            f"{service} at {where} denied pipeline {names} what a drain needs{said}: {grant} the user that "
            f"password_env/connection_id logs in as (its ACL: docs/config.md lists what a drain needs)")
    if failure == "untrusted":
        return "untrusted", (
            f"{service} at {where}: the TLS handshake of pipeline {names} failed{said}: check "
            f"{source.ca_field}, the CA (PEM) that signed the server's certificate")
    if failure == "login_refused":
        return "login_refused", (
            f"{service} at {where} refused the login of pipeline {names}{said}: check the password "
            f"in the environment variable or Airflow connection that password_env/connection_id names")
    embedded = [p for p in ours if getattr(p.source, field) is None]
    fixes = []
    if embedded:
        fixes.append(f"start the embedded {service} with `{command_line('services up', cfg.source_file)}` (its port: services.{kind}_port "
                     f"in the config or DELTADRAIN_{kind.upper()}_PORT)")
    if len(embedded) < len(ours):
        fixes.append(f"check source.{field} of pipeline {names} in {cfg.source_file} and that the server runs")
    return "unreachable", f"cannot reach {service} at {where} for pipeline {names}{said}: " + "; or ".join(fixes)
