"""The Kafka ACLs a drain's user needs on a broker whose authorizer is on: what drain, status, backfill
and replay ask of the broker, and the one a denial names. The embedded broker's user has exactly these
(on every topic and group); docs/config.md lists them for users who grant the same on their cluster."""

from __future__ import annotations

# (resource type, operation, what needs it). READ implies DESCRIBE on the same resource in Kafka.
DRAIN_ACLS = (
    ("topic", "READ", "drain, backfill, reprocess: the records"),
    ("topic", "DESCRIBE", "the partitions, end offsets and topic id (drain, status)"),
    ("topic", "WRITE", "replay sends dead letters back (an idempotent producer); `deltadrain produce`"),
    ("group", "READ", "the group offsets: claim notices and the commit after the lake's (drain, status)"),
)

# A denial's error name -> the resource type whose ACL it lacks.
DENIED_RESOURCE = {"TOPIC_AUTHORIZATION_FAILED": "topic", "GROUP_AUTHORIZATION_FAILED": "group"}


def acl_to_add(reason: str, topic: str, group: str, user: str | None) -> str | None:
    """The ACL a denial (`reason` starts with the error's name, as Kafka.connection_failure gives it)
    asks for, as kafka-acls.sh takes it; None when it names no topic or group ACL (pure)."""
    kind = DENIED_RESOURCE.get(reason.split(":", 1)[0].strip())
    if kind is None:
        return None
    ops = [op for k, op, _ in DRAIN_ACLS if k == kind]
    name = topic if kind == "topic" else group
    principal = f"User:{user}" if user else "User:<the login>"
    return (f"kafka-acls.sh --add --allow-principal {principal} "
            + " ".join(f"--operation {op.capitalize()}" for op in ops) + f" --{kind} {name}")


def acl_bindings(user: str, name: str = "*"):
    """DRAIN_ACLS for `user` on the topics and groups called `name` ("*": every one), as the admin
    API's bindings (the embedded broker's user)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    return [AclBinding(ResourceType[kind.upper()], name, ResourcePatternType.LITERAL, f"User:{user}", "*",
                       AclOperation[op], AclPermissionType.ALLOW) for kind, op, _ in DRAIN_ACLS]
