"""Transforms that kill their drain run on one message: what a message that crashes the process (a
native library's fault, running out of memory) does to a run. The tests of dead runs use them:
`crash_on_marker` with a real SIGKILL through the CLI, `abandon_on_marker` in the test's process for
the crash loops that need many deaths in a row (failpoints.ABANDON)."""

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


def crash_then_fail_on_marker(df):
    """On the marker: the first `deltadrain.cli` run to meet it is killed (SIGKILL), the second one's
    transform raises for it, later ones pass it. The runs are told apart by their process id, kept
    in the file that DELTADRAIN_TEST_RUNS_FILE names (read here, in the driver, and shipped in the
    closure), so that a run's repeated evaluations while it isolates a culprit count once."""
    import os

    runs_file = os.environ["DELTADRAIN_TEST_RUNS_FILE"]

    def kill_then_fail(pid):
        import os
        import signal

        with open(runs_file, "a+") as f:
            f.seek(0)
            seen = f.read().split()
            if str(pid) not in seen:
                f.write(f"{pid}\n")
                seen.append(str(pid))
        turn = seen.index(str(pid))
        if turn == 0:
            os.kill(pid, signal.SIGKILL)
        elif turn == 1:
            raise ValueError("the marker fails this run's transform")

    return _on_marker(df, kill_then_fail)


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
