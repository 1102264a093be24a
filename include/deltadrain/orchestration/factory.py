"""The DAG factory: the pipeline config in, deltadrain's DAGs out.

- deltadrain__<pipeline>__ingest: wait for work (deferred) -> drain (spark-submit) -> quality of the batch;
                                 on_data: scheduled on the source's Assets, which their watchers mark -> drain
- deltadrain__<pipeline>__quality: a continuous or on_data pipeline's batch checks, on the target's Asset
- deltadrain__reaper:            stuck claims? -> reap each pipeline that has some
- deltadrain__replay:            manual, validated Params -> the pipeline's replay task (spark-submit, its pool)
                                 -> after a reprocess, the batch check of the batches it rewrote
- deltadrain__quality:           daily, each pipeline's owed batches and its whole table against its suite
- deltadrain__maintenance:       daily, OPTIMIZE and VACUUM of each pipeline's tables and the shared ones

Parsing reads the config file and nothing else: no source, Spark or Delta is touched until a task runs.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, AssetAny, CronDataIntervalTimetable, Param, task

from deltadrain.config import CONTINUOUS, ON_DATA, DeltadrainConfig, PipelineConfig, load_config
from deltadrain.heal.replay import MAX_LIMIT
from deltadrain.names import (
    ALERTS_TASK,
    MAINTENANCE_DAG,
    QUALITY_DAG,
    REAPER_DAG,
    REPLAY_DAG,
    batch_quality_dag_id,
    ingest_dag_id,
    pool_name,
    replay_quality_task_id,
    replay_task_id,
)
from deltadrain.orchestration.assets import dlq_asset, source_assets, target_asset
from deltadrain.orchestration.operators import (
    AlertsOperator,
    DrainOperator,
    MaintainOperator,
    QualityOperator,
    ReplayOperator,
)
from deltadrain.orchestration.sensors import SourceWorkSensor, StuckClaimsSensor
from deltadrain.sources import NamesPartitions, reaper_of, source_of


def _config_arg(cfg: DeltadrainConfig) -> str | None:
    return str(cfg.source_file) if cfg.source_file else None


def ingest_dag(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> DAG:
    af = pipeline.airflow
    # An interval timetable: every run has a data interval, which is what a backfill run re-reads. Or
    # continuous: a run starts as soon as the last one ended, and its sensor waits for the next work.
    # Or on_data: a run starts when a watcher marked one of the source's Assets; no sensor then waits.
    schedule: str | CronDataIntervalTimetable | AssetAny | None
    on_data = pipeline.schedule == ON_DATA
    if on_data:
        schedule = AssetAny(*source_assets(cfg, pipeline, _config_arg(cfg)))
    elif pipeline.schedule in (None, CONTINUOUS):
        schedule = pipeline.schedule
    else:
        schedule = CronDataIntervalTimetable(pipeline.schedule, timezone="UTC")
    doc = (f"Drains **{pipeline.name}** ({pipeline.source.kind}) into `{cfg.target_path(pipeline)}` "
           f"exactly once; dead letters in `{cfg.dlq_path(pipeline)}`.\n\n"
           "- a scheduled or manual run waits for new messages, stuck claims or a gap, then drains one batch, or up "
           f"to {af.max_batches_per_run} while full ones wait, and checks each batch's data quality;\n"
           "- a backfill run (`airflow backfill create`, or Backfill in the UI) re-reads the source's retained "
           "history of its interval and MERGEs it: missing rows appear, present rows are not duplicated, "
           "the live checkpoint does not move and nothing is acknowledged;\n"
           "- a gap (messages the source deleted before a commit held them) is recorded by the next commit; "
           "under `on_gap: fail` it first stops the runs, until you trigger one with **Accept gaps** on;\n"
           "- a drain task that dies (a crash, its `execution_timeout`, out of memory, a worker restart) convicts "
           "nothing: the runs after it read half of what it read at a time, and only a message that was alone in "
           f"`max_retries` runs that died is a dead letter, so a message that kills every run cannot stop the "
           "pipeline and takes no other message with it.")
    if on_data:
        doc += ("\n- `schedule: on_data`: no sensor; a run starts when a watcher in the triggerer marks one of the "
                "source's Assets (new messages, stale claims or a gap it has not woken the DAG for), and events "
                "that come during a run make at most one more run. Not backfillable: no data intervals.")
    if pipeline.alerts.enabled:
        doc += ("\n- `alerts`, after the drain whatever became of it, fails with the figure when the lag, the oldest "
                "pending message or the rise of dead letters passes the pipeline's `alerts:` thresholds.")
    with DAG(
        dag_id=ingest_dag_id(pipeline.name),
        schedule=schedule,
        start_date=af.start_date,
        catchup=False,
        max_active_runs=1,
        tags=["deltadrain", pipeline.source.kind],
        doc_md=doc,
        params={"accept_gaps": Param(False, type="boolean", title="Accept gaps",
                                     description="Go on past the gaps that stopped this pipeline (on_gap: continue "
                                                 "for this run only); its commit records them. Leave off for "
                                                 "scheduled runs.")},
        default_args={
            "retries": af.retries, "retry_delay": af.retry_delay, "retry_exponential_backoff": 2.0,
            "max_retry_delay": af.max_retry_delay, "execution_timeout": af.execution_timeout,
            "pool": pool_name(pipeline.name),
        },
    ) as dag:
        # The drain's outlets: every run that drained updates the target's and the dead letters' Assets.
        drain = DrainOperator(task_id="drain", pipeline=pipeline.name, config=_config_arg(cfg),
                              outlets=[target_asset(cfg, pipeline), dlq_asset(cfg, pipeline)])
        if not on_data:
            wait = SourceWorkSensor(
                task_id="wait_for_work", pipeline=pipeline.name, config=_config_arg(cfg),
                poll_seconds=af.poll_interval.total_seconds(), timeout=af.wait_timeout.total_seconds(),
                poke_interval=af.poll_interval.total_seconds(), soft_fail=True, retries=0,
                # Deferred sensors hold no worker slot; the pool is for the drain.
                pool="default_pool")
            wait >> drain
        if not checks_beside_drains(pipeline):
            # The target as its inlet: the asset graph shows the check reading what the drain wrote.
            drain >> QualityOperator(task_id="quality", pipeline=pipeline.name, config=_config_arg(cfg),
                                     drain_task="drain", inlets=[target_asset(cfg, pipeline)])
        if pipeline.alerts.enabled:
            # all_done: after the drain whatever became of it. A failed drain (or a source the sensor
            # could not reach) is when lag and the oldest message grow, and a run skipped for want of
            # work still checks the dead letters. Cheap reads: no pool slot, no retries.
            drain >> AlertsOperator(task_id=ALERTS_TASK, pipeline=pipeline.name, config=_config_arg(cfg),
                                    trigger_rule="all_done", pool="default_pool", retries=0,
                                    execution_timeout=timedelta(minutes=5))
    return dag


def checks_beside_drains(pipeline: PipelineConfig) -> bool:
    """A continuous or on_data pipeline's batches are checked by a DAG of their own (`batch_quality_dag`),
    which its drains' asset events start, so that the next ingest run need not wait for the check (Great
    Expectations alone takes seconds to import). Only a check that cannot write to the target may run
    beside a drain: a quarantine moves rows out of it, so it stays in the ingest run, in the pipeline's pool."""
    return pipeline.schedule in (CONTINUOUS, ON_DATA) and pipeline.quality.on_failure != "quarantine"


def batch_quality_dag(cfg: DeltadrainConfig, pipeline: PipelineConfig) -> DAG:
    """Checks the committed batches of `pipeline` that no check has a result for, whenever its drains
    updated the target (the drain task's outlet). Events that arrive while a check runs make one more run,
    which takes all the batches they stand for."""
    with DAG(dag_id=batch_quality_dag_id(pipeline.name), schedule=[target_asset(cfg, pipeline)],
             start_date=pipeline.airflow.start_date, catchup=False, max_active_runs=1,
             tags=["deltadrain", pipeline.source.kind],
             doc_md=f"Great Expectations on each batch the event-driven ingest of **{pipeline.name}** commits, "
                    "after the drain that committed it, without holding up the next one: every committed "
                    "batch with no check result yet. The pipeline's policy decides (fail, warn).",
             default_args={"retries": pipeline.airflow.retries, "retry_delay": pipeline.airflow.retry_delay,
                           "execution_timeout": pipeline.airflow.execution_timeout}) as dag:
        # No pool: the check reads the target and appends to the results table; the drains keep the slot.
        QualityOperator(task_id="quality", pipeline=pipeline.name, config=_config_arg(cfg), owed=True)
    return dag


# The daily owed check leaves the batches committed within this to the ingest run that drained them:
# that run's quality task may be waiting for the pool, and checking first would check them twice.
OWED_SETTLE = timedelta(hours=1)


def quality_dag(cfg: DeltadrainConfig) -> DAG:
    with DAG(dag_id=QUALITY_DAG, schedule="@daily", start_date=min(p.airflow.start_date for p in cfg.pipelines),
             catchup=False, max_active_runs=1, tags=["deltadrain"],
             doc_md="Daily, per pipeline: first the committed batches no check has a result for yet "
                    "(`owed_<pipeline>`: a drain that committed and then failed, with no ingest run since to "
                    "check them; batches of the last hour are left to their ingest run), then the whole target table against its Great Expectations suite "
                    "(`check_<pipeline>`). Results are appended to the quality results table, Data Docs rendered.",
             default_args={"retries": 1, "retry_delay": timedelta(minutes=5),
                           "execution_timeout": timedelta(hours=2)}) as dag:
        for p in cfg.pipelines:
            # No edge between the two: a run's state comes from its leaf tasks, so a failed owed check
            # must be a leaf to fail the run, and it is no reason to leave the table unchecked. The
            # pool runs them one at a time; the owed batches go first when both wait.
            QualityOperator(task_id=f"owed_{p.name}", pipeline=p.name, config=_config_arg(cfg), owed=True,
                            settle_s=int(OWED_SETTLE.total_seconds()),
                            pool=pool_name(p.name), priority_weight=2, weight_rule="absolute")
            QualityOperator(task_id=f"check_{p.name}", pipeline=p.name, config=_config_arg(cfg), whole_table=True,
                            pool=pool_name(p.name), priority_weight=1, weight_rule="absolute")
    return dag


def maintenance_dag(cfg: DeltadrainConfig) -> DAG:
    m = cfg.maintenance
    what = " and ".join(x for x, on in (("OPTIMIZE", m.optimize), ("VACUUM", m.vacuum)) if on)
    with DAG(dag_id=MAINTENANCE_DAG, schedule=m.schedule, start_date=min(p.airflow.start_date for p in cfg.pipelines),
             catchup=False, max_active_runs=1, tags=["deltadrain"],
             doc_md=f"{what} of each pipeline's Delta tables (target, dead letters, quarantine) and of the shared "
                    "metrics and quality results tables: every batch adds small files, and compacting them keeps "
                    "the MERGE, the checks and the view fast. VACUUM keeps replaced files for "
                    f"`maintenance.retain` ({m.retain}). A pipeline's task runs in its pool, between its drains.",
             default_args={"retries": 1, "retry_delay": timedelta(minutes=5),
                           "execution_timeout": timedelta(hours=2)}) as dag:
        for p in cfg.pipelines:
            MaintainOperator(task_id=f"maintain_{p.name}", pipeline=p.name, config=_config_arg(cfg),
                             pool=pool_name(p.name))
        MaintainOperator(task_id="maintain_shared_tables", config=_config_arg(cfg))
    return dag


@task(task_id="reap", map_index_template="{{ pipeline }}")
def reap_pipeline(pipeline: str, config: str | None = None) -> dict:
    """Take over one pipeline's stuck claims and remove its dead consumers."""
    from deltadrain.config import load_config as load

    cfg = load(config)
    found = cfg.pipeline(pipeline)
    report = reaper_of(found).reap(cfg, found)
    print(f"deltadrain: reaped {pipeline}: {report}")
    return report


def reaper_dag(cfg: DeltadrainConfig) -> DAG:
    with DAG(dag_id=REAPER_DAG, schedule="*/5 * * * *", start_date=min(p.airflow.start_date for p in cfg.pipelines),
             catchup=False, max_active_runs=1, tags=["deltadrain"],
             doc_md="Every 5 minutes: finds claims held longer than `min_idle_ms` by drains that are gone, "
                    "moves them to the reaper so that the next drain takes them at once, and removes "
                    "consumers with nothing pending.",
             default_args={"retries": 1, "retry_delay": timedelta(seconds=30),
                           "execution_timeout": timedelta(minutes=10)}) as dag:
        stuck = StuckClaimsSensor(task_id="find_stuck_claims", config=_config_arg(cfg), mode="poke",
                                  poke_interval=15, timeout=60, soft_fail=True)
        reap_pipeline.partial(config=_config_arg(cfg)).expand(pipeline=stuck.output)
    return dag


def replay_params(cfg: DeltadrainConfig) -> dict[str, Param]:
    names = [p.name for p in cfg.pipelines]
    streams = [key for p in cfg.pipelines if isinstance(source := source_of(p), NamesPartitions)
               for key in source.partition_names(p)]
    examples: dict[str, Any] = {"examples": streams} if streams else {}
    position = r"^[0-9]+(-[0-9]+)?$"
    return {
        # No default: a trigger that names no pipeline is refused, never replayed on the YAML's first one.
        "pipeline": Param(type="string", enum=names, title="Pipeline",
                          description="required: the pipeline whose dead letters or messages to replay"),
        "mode": Param("dlq", type="string", enum=["dlq", "reprocess"], title="Mode",
                      description="dlq: send DEAD entries back to the source. reprocess: re-read PUBLISHED "
                                  "messages from the source's retained history through the current transform."),
        "message_ids": Param([], type="array", items={"type": "string"}, title="Message ids",
                             description="only these message ids (empty: no filter)"),
        "error_contains": Param(None, type=["null", "string"], title="Error contains",
                                description="dlq mode: only entries whose error contains this text"),
        "since": Param(None, type=["null", "string"], format="date-time", title="Since",
                       description="dlq: last failure at or after; reprocess: appended at or after"),
        "until": Param(None, type=["null", "string"], format="date-time", title="Until",
                       description="before this time; must be after 'since'"),
        # The form proposes the stream keys (a datalist); not an enum: a Kafka partition is a number
        # the broker knows, not the YAML. validate checks either against the pipeline.
        "partition": Param(None, type=["null", "string"], title="Partition",
                           description="a stream key (orders:{0}) or a Kafka partition number (3)",
                           **examples),
        "position_from": Param(None, type=["null", "string"], pattern=position, title="Position from",
                               description="stream id (ms-seq) or Kafka offset, inclusive"),
        "position_to": Param(None, type=["null", "string"], pattern=position, title="Position to",
                             description="stream id (ms-seq; ms alone takes that whole millisecond) or Kafka "
                                         "offset, inclusive"),
        "limit": Param(1000, type="integer", minimum=1, maximum=MAX_LIMIT, title="Limit"),
        "dry_run": Param(True, type="boolean", title="Dry run",
                         description="only show what would be replayed"),
        "requested_by": Param(None, type=["null", "string"], title="Requested by",
                              description="who asked (the view sets it); the run records the user who triggered it"),
    }


@task(task_id="validate")
def validate_request(config: str | None = None, **context) -> dict:
    """The form's values, checked together (ranges, pipeline); the replay job gets exactly these."""
    from deltadrain.config import load_config as load
    from deltadrain.heal.replay import parse_request

    request = parse_request(load(config), dict(context["params"]))
    # Who asked is who Airflow says triggered the run, not what its conf claims.
    request.requested_by = getattr(context.get("dag_run"), "triggering_user_name", None)
    return request.model_dump(mode="json")


@task.branch(task_id="route")
def route_request(request: dict) -> str:
    """The replay task of the request's pipeline; the others are skipped."""
    return replay_task_id(request["pipeline"])


REPLAY_RUNS = 16  # Airflow's own default per DAG


def replay_dag(cfg: DeltadrainConfig) -> DAG:
    with DAG(dag_id=REPLAY_DAG, schedule=None, start_date=min(p.airflow.start_date for p in cfg.pipelines),
             catchup=False, tags=["deltadrain"], params=replay_params(cfg),
             # Runs of different pipelines go side by side: one pipeline's busy pool must not hold back
             # another's replay. A pipeline's own replay tasks go one at a time (below).
             max_active_runs=REPLAY_RUNS,
             doc_md="Manual replay. `dlq` re-enqueues DEAD entries to their source partition and marks them "
                    "REPLAYED with this run's id; `reprocess` re-reads PUBLISHED messages from the source's "
                    "retained history and updates their rows through the current transform. Replaying the "
                    "same entries twice never duplicates a row; a pipeline's replays go one at a time, so a second "
                    "run finds them REPLAYED and sends nothing; replays of different pipelines run side by side. "
                    "The request's pipeline picks the task that runs it (`replay_<pipeline>`, the others are "
                    "skipped); that task runs in the pipeline's pool, between its drains. After a reprocess, "
                    "`quality_<pipeline>` checks the batches whose rows it rewrote, as the ingest DAG checks new "
                    "batches. Start with dry_run to see what would go.",
             default_args={"retries": 0, "execution_timeout": timedelta(minutes=60)}) as dag:
        validated = validate_request(config=_config_arg(cfg))
        # One task per pipeline, in that pipeline's pool: a reprocess MERGE or a DLQ replay's marks then
        # run between the pipeline's drains, quality checks and maintenance, not during them.
        # task.branch's typing keeps the function's own parameters; TaskFlow hands it the XComArg's value.
        route = route_request(validated)  # type: ignore[arg-type]
        for p in cfg.pipelines:
            # Ahead of the pipeline's drains in the pool's queue: someone is waiting for a replay. One
            # at a time across runs, whatever the pool's slots: a replay selects DEAD entries, sends
            # them, then marks them REPLAYED, so two over the same entries (a double submit in the
            # view) would both send them.
            replay = ReplayOperator(task_id=replay_task_id(p.name), request_task="validate", config=_config_arg(cfg),
                                    pool=pool_name(p.name), priority_weight=10, weight_rule="absolute",
                                    max_active_tis_per_dag=1)
            # A reprocess rewrote rows of drained batches through the current transform: their new
            # values get the batch check new rows get (only those batches: owed ones are the ingest and
            # daily DAGs'). A dlq replay's rows are checked with the batch that drains them again, so
            # this task skips. Retried once: its batches already have results, so no later check
            # takes them on if it fails.
            route >> replay >> QualityOperator(
                task_id=replay_quality_task_id(p.name), pipeline=p.name, config=_config_arg(cfg),
                drain_task=replay.task_id, catch_up=False, pool=pool_name(p.name), priority_weight=10,
                weight_rule="absolute", retries=1, retry_delay=timedelta(minutes=1))
    return dag


def build_dags(cfg: DeltadrainConfig | None = None) -> dict[str, DAG]:
    cfg = cfg or load_config()
    dags = {ingest_dag_id(p.name): ingest_dag(cfg, p) for p in cfg.pipelines}
    dags.update({batch_quality_dag_id(p.name): batch_quality_dag(cfg, p) for p in cfg.pipelines
                 if checks_beside_drains(p)})
    dags[REAPER_DAG] = reaper_dag(cfg)
    dags[REPLAY_DAG] = replay_dag(cfg)
    dags[QUALITY_DAG] = quality_dag(cfg)
    if cfg.maintenance.optimize or cfg.maintenance.vacuum:
        dags[MAINTENANCE_DAG] = maintenance_dag(cfg)
    return dags
