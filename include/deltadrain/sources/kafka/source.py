"""Kafka topics as a deltadrain source: a fixed offset range per partition and run, the ending
offsets in the lake's commit, the group offsets committed after it for lag tools. Each step lives in
its own module here; this one answers the `Source` base and its capability by calling them
(imported on use)."""

from __future__ import annotations

from deltadrain.sources import LakeSide, Source, SourceNote, SuggestsGrants

# librdkafka's codes for "no broker answered" (as opposed to a broker that answered with an error).
UNREACHABLE = frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN", "_TIMED_OUT", "_RESOLVE"})
LOGIN_REFUSED = frozenset({"_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED"})
UNTRUSTED = frozenset({"_SSL"})
DENIED = frozenset({"TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED",
                    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"})


class Kafka(SuggestsGrants, Source):
    """A range is not a lease (nothing to reap: the next drain reads a failed run's offsets again), and
    the partitions are numbers the broker knows; a denial names the resource, not the ACL to add
    (`SuggestsGrants`)."""

    kind = "kafka"
    service = "Kafka"
    address_field = "bootstrap_servers"
    ca_field = "source.security.ssl_ca_location"

    def reads(self, pipeline) -> list[str]:
        return [pipeline.source.topic]

    def address(self, cfg, pipeline) -> str:
        from deltadrain.sources.kafka.client import kafka_bootstrap

        return kafka_bootstrap(cfg, pipeline.source)

    def connection_failure(self, exc: BaseException) -> tuple[str, str] | None:
        if type(exc).__name__ != "KafkaException" or not exc.args or not hasattr(exc.args[0], "name"):
            return None
        error = exc.args[0]
        name = error.name()
        for kind, names in (("unreachable", UNREACHABLE), ("login_refused", LOGIN_REFUSED), ("denied", DENIED),
                            ("untrusted", UNTRUSTED)):
            if name in names:
                return kind, f"{name}: {error.str()}"
        return None

    def acl_to_add(self, pipeline, reason: str) -> str | None:
        from deltadrain.sources.kafka.acl import acl_to_add
        from deltadrain.sources.kafka.client import sasl_credentials

        source = pipeline.source
        try:
            user = sasl_credentials(source).username if source.security.sasl_mechanism else None
        except Exception:  # the login cannot be read here: the grant names the principal generically
            user = None
        return acl_to_add(reason, source.topic, source.group, user)

    def drain(self, cfg, pipeline, spark, run_id=None):
        from deltadrain.sources.kafka.drain import KafkaDrain

        return KafkaDrain(cfg, pipeline, spark, run_id).run()

    def read_interval(self, spark, cfg, pipeline, start, end, scratch):
        from deltadrain.sources.kafka.history import kafka_interval_rows

        return kafka_interval_rows(spark, cfg, pipeline, start, end, str(scratch))

    def read_places(self, spark, cfg, pipeline, places, scratch):
        from deltadrain.sources.kafka.history import kafka_offset_rows

        return kafka_offset_rows(spark, cfg, pipeline, [(part, int(pos)) for part, pos in places],
                                 str(scratch / "history"))

    def send_back(self, cfg, pipeline, entries) -> None:
        from deltadrain.sources.kafka.replay import send_back

        send_back(cfg, pipeline, entries)

    def replay_problem(self, pipeline, partition: str | None, positions: dict[str, str]) -> str | None:
        if partition is not None and not (partition.isascii() and partition.isdigit()):
            return f"partition: a Kafka partition is a number, got '{partition}'"
        for name, value in positions.items():
            # A Kafka offset written as `5-3` would leave offset 5 out (the field's own check leaves
            # digits, or ms-seq).
            if "-" in value:
                return f"{name}: a Kafka position is an offset (a number), got '{value}'"
        return None

    def probe(self, cfg, pipeline):
        from deltadrain.sources.kafka.probe import probe_kafka

        return probe_kafka(cfg, pipeline)

    def counts(self, cfg, pipeline, lake: LakeSide, until: float | None = None, quick: bool = False) -> dict:
        from deltadrain.sources.kafka.client import check_reachable, kafka_consumer_conf
        from deltadrain.sources.kafka.offsets import OffsetError, TopicMissing
        from deltadrain.sources.kafka.status import dead_after_ms, kafka_counts, missing_topic

        checkpoint = lake.checkpoint
        positions = checkpoint.positions
        if checkpoint.found_in == "rows":  # rows hold the last offset read, the checkpoint the next one
            positions = {k: str(int(v) + 1) for k, v in positions.items()}
        conf = kafka_consumer_conf(cfg, pipeline)
        if quick:
            # A page or `status`: a broker that is down is said at once, in a note, not logged per retry.
            check_reachable(conf["bootstrap.servers"])
            conf.update({"socket.timeout.ms": "3000", "log_level": "2"})
        try:
            return kafka_counts(conf, pipeline.source, positions, lake.published(), lake.dead(),
                                first_run=checkpoint.batch == 0, crashes=checkpoint.meta.get("crashes"),
                                min_idle_ms=pipeline.min_idle_ms, stale_ms=dead_after_ms(pipeline),
                                committed_by=checkpoint.run_id, complete=checkpoint.found_in != "rows", until=until)
        except TopicMissing:  # the broker answered: no such topic (yet)
            return missing_topic(pipeline, positions, cfg.source_file)
        except OffsetError as exc:  # the broker answered: a recreated topic, or one it cannot serve
            raise SourceNote(str(exc)) from exc

    def oldest_pending_ms(self, cfg, pipeline, counts: dict) -> int | None:
        from deltadrain.sources.kafka.client import kafka_consumer_conf
        from deltadrain.sources.kafka.status import oldest_pending_ms

        return oldest_pending_ms(kafka_consumer_conf(cfg, pipeline), pipeline.source.topic, counts)

    def stale_after_ms(self, pipeline) -> int:
        from deltadrain.sources.kafka.status import stale_after_ms

        return stale_after_ms(pipeline)

    def stale_reason(self, after_ms: int) -> str:
        return (f"older than the drain task's execution_timeout ({after_ms} ms): its run is gone, "
                "the next drain reads the range again")

    def status_lines(self, status: dict) -> list[str]:
        from deltadrain.sources.kafka.status import status_lines

        return status_lines(status)


SOURCE = Kafka()
