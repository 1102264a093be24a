"""One drain run, in the order the contract gives (docs/contract.md): `drain` holds the order and the
shared steps; `stage` claims into Parquet, `commit` MERGEs with the checkpoint in the same commit,
`outcome` decides the compare-and-set result, `isolation` finds a message that kills runs,
`layout` is schema evolution as a run applies it, and `upsert` decides which change of a key applies in
upsert mode. Each source supplies its own steps (deltadrain.sources).
"""

__all__ = ["commit", "drain", "isolation", "layout", "outcome", "stage", "upsert"]
