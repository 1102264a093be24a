"""The lake: Delta tables and where they live.

`delta` creates tables and reads their log with delta-rs; `checkpoint` reads a pipeline's
checkpoint back from its target's commits; `deadletter` and `metrics` are deltadrain's own tables;
`objectstore` and `scratch` say where a lake on S3 is and where a run stages; `maintain` compacts
and vacuums.
"""

__all__ = ["checkpoint", "deadletter", "delta", "maintain", "metrics", "objectstore", "scratch"]
