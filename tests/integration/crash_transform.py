"""Transforms that kill their drain run on one message: what a message that crashes the process (a
native library's fault, running out of memory) does to a run. The tests of dead runs use them:
`crash_on_marker` with a real SIGKILL through the CLI, `crash_then_fail_on_marker` with one SIGKILL
and then a failure, `abandon_on_marker` in the test's process for the crash loops that need many
deaths in a row (failpoints.ABANDON)."""

CRASH_MARKER = "__crash__"


def _on_marker(df, act):
    """`df` with a UDF that calls `act(pid)` for a `status` of CRASH_MARKER, pid being the
    `deltadrain.cli` process the Spark task runs under (nothing is called outside that command);
    every row passes unchanged. `act` must be defined inside a function, as the UDF is here, so
    that Spark ships both by value: the workers need not import this module."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def check(status):
        import os

        if status != CRASH_MARKER:
            return status
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"deltadrain.cli" in f.read():
                    act(pid)
                    break
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        return status

    return df.withColumn("status", F.udf(check, StringType())(F.col("status")))


def crash_on_marker(df):
    """Kills (SIGKILL: nothing of the run gets to clean up) the `deltadrain.cli` process whose Spark
    task meets the marker. A drain outside that command (in the test process) is not killed, so the
    tests only use it through the CLI."""

    def kill(pid):
        import os
        import signal

        os.kill(pid, signal.SIGKILL)

    return _on_marker(df, kill)


# The turn of the run applying crash_then_fail_on_marker, and the file each turn that met the marker is noted in.
TURN_ENV, RUNS_ENV = "DELTADRAIN_TEST_TURN", "DELTADRAIN_TEST_RUNS_FILE"


def crash_then_fail_on_marker(df):
    """On the marker, by the turn of the run ($DELTADRAIN_TEST_TURN, read here, in the drain's process,
    and shipped in the closure): turn 0 is killed (SIGKILL of the drain's process, wherever its Spark
    tasks run: in its own driver or on a Connect server), turn 1's transform raises for it, later
    turns pass it. Each turn that met it is noted in $DELTADRAIN_TEST_RUNS_FILE, as often as a run's
    evaluations meet it while it isolates a culprit."""
    import os

    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    turn, runs_file, drain_pid = int(os.environ[TURN_ENV]), os.environ[RUNS_ENV], os.getpid()

    def check(status):
        import os
        import signal

        if status != CRASH_MARKER:
            return status
        with open(runs_file, "a") as f:
            f.write(f"{turn}\n")
        if turn == 0:
            os.kill(drain_pid, signal.SIGKILL)
        elif turn == 1:
            raise ValueError("the marker fails this run's transform")
        return status

    return df.withColumn("status", F.udf(check, StringType())(F.col("status")))


def abandon_on_marker(df):
    """Stops the run that meets the marker as a SIGKILL would, in the test's own process: the UDF
    raises an error carrying failpoints.ABANDON, and the drain leaves its claims and claim notices
    behind and cleans nothing up (deltadrain.failpoints.Abandoned reaches the caller)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    from deltadrain.failpoints import ABANDON

    def check(status):
        if status == CRASH_MARKER:
            raise RuntimeError(f"{ABANDON}: the marker stops this run")
        return status

    return df.withColumn("status", F.udf(check, StringType())(F.col("status")))
