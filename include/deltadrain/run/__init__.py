"""One drain run, in the order the contract gives (docs/contract.md): `drain` holds the order (`Drain.run`)
and the shared publish; `steps` is what a source supplies to it (its plan, its gaps) and the capabilities
only some sources have; `rows` makes the rows a run commits, its dead letters and culprits; `stage` claims
into Parquet, `commit` MERGEs with the checkpoint in the same commit, `outcome` decides the compare-and-set
result, `isolation` finds a message that kills runs, `layout` is schema evolution as a run applies it,
`upsert` decides which change of a key applies in upsert mode, and `summary` is what a run reports. Each
source supplies its own steps (deltadrain.sources).
"""

__all__ = ["commit", "drain", "isolation", "layout", "outcome", "rows", "stage", "steps", "summary", "upsert"]
