"""The Valkey ACL a drain needs: the commands every Valkey step of deltadrain sends (drain, acknowledge,
reap, gaps, status, probe, replay and `produce`), and the rule that grants them. The embedded Valkey's
user has exactly this; docs/config.md lists it for users who write the same ACL on their server."""

from __future__ import annotations

# Grouped by what needs them; a subcommand is `command|subcommand`.
DRAIN_COMMANDS = (
    # the connection: valkey-py's handshake and health checks
    "auth", "hello", "ping", "client|setinfo", "client|setname", "select",
    # reading and holding entries (drain, reaper, gaps)
    "xreadgroup", "xautoclaim", "xclaim", "xack", "xpending", "xrange", "xrevrange", "xlen",
    "xinfo|stream", "xinfo|groups", "xinfo|consumers",
    "xgroup|create", "xgroup|setid", "xgroup|delconsumer", "xgroup|destroy", "exists",
    # replay and `deltadrain produce` append
    "xadd",
    # the gap and failure keys (hashes), the scripts that move claims and positions atomically
    "hset", "hget", "hmget", "hgetall", "hdel", "hincrby", "del", "eval", "evalsha", "multi", "exec",
)


def acl_rule(keys: str = "*") -> str:
    """The rule (after `ACL SETUSER <user> on >password`) for a drain's user: no channel, only
    DRAIN_COMMANDS, on keys matching `keys` (its streams and the `deltadrain:` keys of its pipelines)."""
    return " ".join([f"~{keys}", "resetchannels", "-@all", *(f"+{c}" for c in DRAIN_COMMANDS)])


# The commands a run sends only after its commit, in forms that change nothing: no entry has the id
# 0-0, and no hash the field "". Run inside a script, each is checked against the ACL as the real ones.
_AFTER_COMMIT_STREAM = """
redis.call('XACK', KEYS[1], ARGV[1], '0-0')
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, '0-0', 'JUSTID')
return 0
"""
_AFTER_COMMIT_HASH = """
redis.call('HGET', KEYS[1], '')
redis.call('HDEL', KEYS[1], '')
return 0
"""


def check_after_commit(client, stream: str, group: str, consumer: str, hashes: list[str]) -> None:
    """Try what the run needs after its commit (XACK, the scripts that hand claims over and forget
    gaps) before it claims anything: a user whose ACL lacks one fails here with NoPermissionError,
    with nothing claimed, committed or acknowledged, instead of after a commit it cannot acknowledge.
    `consumer` is the run's own (XCLAIM makes it; the run removes it at its end)."""
    client.xack(stream, group, "0-0")
    client.eval(_AFTER_COMMIT_STREAM, 1, stream, group, consumer)
    for key in hashes:
        client.eval(_AFTER_COMMIT_HASH, 1, key)
