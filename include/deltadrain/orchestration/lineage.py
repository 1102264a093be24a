"""OpenLineage for deltadrain's tasks, through Airflow's openlineage provider (docs/observability.md).

The provider's listener asks each operator for its lineage when the task ends
(`get_openlineage_facets_on_complete` / `_on_failure`, DeltadrainSparkOperator), which `task_lineage`
made as the job ended: the datasets deltadrain.observe.lineage names, a Delta table's columns as its
schema facet and the rows the task wrote as its output statistics. The provider sends the event with the transport Airflow's
`[openlineage]` section configures; with none configured it sends nothing, and nothing here runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deltadrain.observe.lineage import Dataset, table_fields, task_datasets

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

__all__ = ["dataset_facets", "lineage_on", "task_lineage"]


def lineage_on() -> bool:
    """Whether the provider sends events (a transport is configured and its listener loaded)."""
    from airflow.providers.openlineage.api import is_openlineage_active

    return is_openlineage_active()


def dataset_facets(dataset: Dataset) -> dict:
    """The schema facet of a Delta table whose columns can be read; none for a source."""
    from openlineage.client.facet_v2 import schema_dataset

    fields = table_fields(dataset.table) if dataset.table else None
    if not fields:
        return {}
    return {"schema": schema_dataset.SchemaDatasetFacet(
        fields=[schema_dataset.SchemaDatasetFacetFields(name=name, type=kind) for name, kind in fields])}


def task_lineage(job: str, config: str | None, pipeline: str | None, summary: dict | None,
                 request: dict | None = None) -> OperatorLineage:
    """The inputs and outputs of one task (`job` as in deltadrain.jobs) for the provider's event."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import output_statistics_output_dataset as stats

    from deltadrain.config import load_config

    cfg = load_config(config)
    inputs, outputs = task_datasets(job, cfg, cfg.pipeline(pipeline) if pipeline else None, summary, request)
    return OperatorLineage(
        inputs=[InputDataset(d.name.namespace, d.name.name, facets=dataset_facets(d)) for d in inputs],
        outputs=[OutputDataset(d.name.namespace, d.name.name, facets=dataset_facets(d),
                               outputFacets={"outputStatistics": stats.OutputStatisticsOutputDatasetFacet(rowCount=d.rows)}
                               if d.rows is not None else {})
                 for d in outputs])
