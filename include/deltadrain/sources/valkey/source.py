"""Valkey streams as a deltadrain source: a consumer group per pipeline, claims in its pending list
(XREADGROUP, XAUTOCLAIM), XACK after the commit. Each step lives in its own module here; this one
answers the `Source` base and its capabilities by calling them (imported on use, so that asking
costs nothing)."""

from __future__ import annotations

from deltadrain.sources import LakeSide, NamesPartitions, Reaps, Source


class Valkey(Reaps, NamesPartitions, Source):
    """Claims sit in the group's pending list until XACK (`Reaps`); the config names the streams
    (`NamesPartitions`)."""

    kind = "valkey"
    service = "Valkey"
    address_field = "url"
    ca_field = "source.tls_ca_file"

    def reads(self, pipeline) -> list[str]:
        return list(pipeline.source.streams)

    def partition_names(self, pipeline) -> list[str]:
        return list(pipeline.source.streams)

    def address(self, cfg, pipeline) -> str:
        import urllib.parse

        from deltadrain.sources.valkey.client import valkey_url

        urls = [urllib.parse.urlsplit(u) for u in valkey_url(cfg, pipeline.source).split(",")]
        return ",".join(f"{url.hostname}:{url.port or 6379}" for url in urls)

    def connection_failure(self, exc: BaseException) -> tuple[str, str] | None:
        if not type(exc).__module__.startswith("valkey"):
            return None
        import valkey.exceptions as v

        if isinstance(exc, v.AuthenticationError):  # a wrong password, or none where the server needs one
            return "login_refused", str(exc)
        if isinstance(exc, v.ConnectionError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):
            # valkey-py words a failed TLS handshake as a failure to connect: the certificate is the fix.
            return "untrusted", str(exc)
        if isinstance(exc, v.ConnectionError | v.TimeoutError):
            return "unreachable", str(exc)
        if isinstance(exc, v.NoPermissionError):  # the user's ACL lacks a command or key
            return "denied", str(exc)
        return None

    def drain(self, cfg, pipeline, spark, run_id=None):
        from deltadrain.sources.valkey.drain import ValkeyDrain

        return ValkeyDrain(cfg, pipeline, spark, run_id).run()

    def read_interval(self, spark, cfg, pipeline, start, end, scratch):
        from deltadrain.run.rows import claim_schema
        from deltadrain.sources.valkey.client import valkey_client
        from deltadrain.sources.valkey.drain import claim_context
        from deltadrain.sources.valkey.history import history_gaps, interval_range, read_history

        ranges = [interval_range(s, start, end) for s in pipeline.source.streams]
        gaps = history_gaps(valkey_client(cfg, pipeline), ranges)  # before the read: what was gone first
        ctx = claim_context(cfg, pipeline, consumer="backfill")
        return read_history(spark, ranges, ctx, claim_schema(pipeline), str(scratch / "history")), gaps

    def read_places(self, spark, cfg, pipeline, places, scratch):
        from deltadrain.positions import StreamId
        from deltadrain.run.rows import claim_schema
        from deltadrain.sources.valkey.drain import claim_context
        from deltadrain.sources.valkey.history import StreamRange, read_history

        by_stream: dict[str, list[str]] = {}
        for stream, position in places:
            by_stream.setdefault(stream, []).append(position)
        ranges = [StreamRange(s, str(min(map(StreamId.parse, ids))), str(max(map(StreamId.parse, ids))), tuple(ids))
                  for s, ids in sorted(by_stream.items())]
        ctx = claim_context(cfg, pipeline, "replay")
        return read_history(spark, ranges, ctx, claim_schema(pipeline), str(scratch / "history"))

    def send_back(self, cfg, pipeline, entries) -> None:
        from deltadrain.sources.valkey.replay import send_back

        send_back(cfg, pipeline, entries)

    def replay_problem(self, pipeline, partition: str | None, positions: dict[str, str]) -> str | None:
        streams = pipeline.source.streams
        if partition is not None and partition not in streams:
            return f"partition: '{partition}' is not one of the pipeline's streams ({', '.join(streams)})"
        return None

    def probe(self, cfg, pipeline):
        from deltadrain.sources.valkey.probe import probe_valkey

        return probe_valkey(cfg, pipeline)

    def counts(self, cfg, pipeline, lake: LakeSide, until: float | None = None, quick: bool = False) -> dict:
        from deltadrain.sources.valkey.client import valkey_client
        from deltadrain.sources.valkey.gaps import gaps_key
        from deltadrain.sources.valkey.status import behind_notes, last_ids, stream_notes, valkey_counts

        # Valkey's own timeouts bound each call; `quick` shortens them to a page's patience.
        client = valkey_client(cfg, pipeline, **({"socket_timeout": 3, "socket_connect_timeout": 3} if quick else {}))
        counts = valkey_counts(client, pipeline.source, gaps_key(pipeline.name), pipeline)
        missing = counts.pop("missing_streams")
        counts["notes"] = stream_notes(pipeline, missing, lake.checkpoint.positions, cfg.source_file) if missing else []
        if pipeline.source.cluster:  # a failover may have lost what a batch committed (docs/semantics.md)
            here = [s for s in pipeline.source.streams if s not in missing]
            counts["notes"] += behind_notes(lake.checkpoint.positions, last_ids(client, here))
        return counts

    def oldest_pending_ms(self, cfg, pipeline, counts: dict) -> int | None:
        from deltadrain.sources.valkey.client import valkey_client
        from deltadrain.sources.valkey.status import oldest_pending_ms

        return oldest_pending_ms(valkey_client(cfg, pipeline, socket_timeout=5, socket_connect_timeout=5),
                                 pipeline.source)

    def stale_after_ms(self, pipeline) -> int:
        # After min_idle_ms the next drain or the reaper takes the entries over.
        return pipeline.min_idle_ms

    def stale_reason(self, after_ms: int) -> str:
        return f"idle over min_idle_ms ({after_ms} ms): the next drain or the reaper takes these entries over"

    def status_lines(self, status: dict) -> list[str]:
        from deltadrain.sources.valkey.status import status_lines

        return status_lines(status)

    def reap(self, cfg, pipeline) -> dict:
        from deltadrain.sources.valkey.reap import reap

        return reap(cfg, pipeline)


SOURCE = Valkey()
