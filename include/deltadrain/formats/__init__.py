"""Payload formats: a message's bytes in, typed columns and dead-letter reasons out.

JSON (`decode`), Avro (`avro`) and Protobuf (`protobuf`) bodies, Debezium's change events
(`debezium`), the Confluent wire format (`confluent`), the schema registry client (`registry`,
`proto_source`) and the choice of decoder for a pipeline (`payloads`). Pure or network-only: no Spark, no lake.
"""

__all__ = ["avro", "confluent", "debezium", "decode", "payloads", "proto_source", "protobuf", "registry"]
