"""A transform that kills its drain run on one message: what a message that crashes the process (a
native library's fault, running out of memory) does to a run. The tests of dead runs use it."""

CRASH_MARKER = "__crash__"


def crash_on_marker(df):
    """Kills the `deltadrain.cli` process whose Spark task meets a `status` of CRASH_MARKER (SIGKILL:
    nothing of the run gets to clean up); every other row passes unchanged. A drain outside that
    command (in the test process) is not killed, so the tests only use it through the CLI."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def check(status):
        # Defined in here so that Spark ships it by value: the workers need not import this module.
        import os
        import signal

        if status != CRASH_MARKER:
            return status
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"deltadrain.cli" in f.read():
                    os.kill(pid, signal.SIGKILL)
                    break
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        return status

    return df.withColumn("status", F.udf(check, StringType())(F.col("status")))


def crash_then_fail_on_marker(df):
    """On the marker: the first `deltadrain.cli` run to meet it is killed (SIGKILL), the second one's
    transform raises for it, later ones pass it. The runs are told apart by their process id, kept
    in the file that DELTADRAIN_TEST_RUNS_FILE names (read here, in the driver, and shipped in the
    closure), so that a run's repeated evaluations while it isolates a culprit count once."""
    import os

    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    runs_file = os.environ["DELTADRAIN_TEST_RUNS_FILE"]

    def check(status):
        import os
        import signal

        if status != CRASH_MARKER:
            return status
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"deltadrain.cli" in f.read():
                    break
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        if pid <= 1:  # not under `deltadrain.cli`: nothing to kill, nor a run to tell apart
            return status
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
        return status

    return df.withColumn("status", F.udf(check, StringType())(F.col("status")))
