"""Replay to a Kafka source: dead letters' original bytes go back to their partitions with an
idempotent producer, carrying the identity their copies need."""

from __future__ import annotations

from deltadrain.config import DeltadrainConfig, KafkaSource, PipelineConfig
from deltadrain.errors import ReplayError
from deltadrain.sources.kafka.drain import REPLAY_ID_HEADER


def kafka_copy_identity(source: KafkaSource, entry: dict, upsert: bool = False) -> tuple[str | None, list[tuple[str, str | bytes | None]]]:
    """(key, headers) of a dead letter's copy, which must get the id its original had, or would have
    had: a copy sent twice (a crash between sending and marking) then lands on one row. The drain
    takes REPLAY_ID_HEADER's value where it would take the record's place (topic-partition-offset)
    for an id; a dead letter with no id (dead after max_retries killed runs, never decoded) carries
    its original's place, so an id-less copy is not named after its own new offset."""

    message_id = entry["message_id"]
    headers: list[tuple[str, str | bytes | None]] = [("deltadrain-replay-of", f"{entry['partition']}@{entry['position']}".encode()),
               (REPLAY_ID_HEADER, (message_id or f"{source.topic}-{entry['partition']}-{entry['position']}").encode())]
    if message_id and source.id_from == "header" and source.id_header:
        headers.append((source.id_header, message_id.encode()))
    if upsert:
        # Upsert mode: a dead letter's message id is its key's text (deltadrain.formats.changes), a JSON
        # object of the key's columns, which the copy carries as its record key.
        return message_id, headers
    # Keep the message's identity where the pipeline reads it from (key or header). An Avro key is not
    # written again (that needs the key's schema id): the copy has none, and the drain takes the replay
    # header's id, which it reads for such a pipeline.
    return (message_id if source.id_from == "key" and source.key_format == "text" else None), headers


def send_back(cfg: DeltadrainConfig, pipeline: PipelineConfig, entries: list[dict]) -> None:
    from confluent_kafka import Producer

    from deltadrain.sources.kafka.client import kafka_client_conf, kafka_source

    source = kafka_source(pipeline)
    producer = Producer({**kafka_client_conf(cfg, pipeline), "enable.idempotence": True, "acks": "all"})
    failures: list[str] = []

    def done(err, _msg):
        if err is not None:
            failures.append(str(err))

    for e in entries:
        # A Kafka dead letter's partition is the topic partition's number: it goes back there.
        # Else -1: the producer's partitioner chooses (confluent-kafka's default).
        partition = int(e["partition"]) if str(e["partition"]).isdigit() else -1
        key, headers = kafka_copy_identity(source, e, pipeline.upsert)
        producer.produce(source.topic, value=e["original"], key=key, partition=partition, headers=headers,
                         on_delivery=done)
        producer.poll(0)
    if producer.flush(60) or failures:
        raise ReplayError(f"Kafka did not take every replayed message: {failures[:3] or 'flush timed out'}")
