"""A transform that hangs on one message, the way a stuck native call or an endless loop would, until
the run is killed (Airflow kills a task at its execution_timeout). The tests of dead runs use it."""

HANG_MARKER = "__hang__"
FLAG_ENV = "DELTADRAIN_TEST_HANG_FLAG"  # a file the hanging task creates, so a test knows it hangs


def hang_on_marker(df):
    """A Spark task that meets a `status` of HANG_MARKER touches $DELTADRAIN_TEST_HANG_FLAG and waits
    until its parent process is gone (the run was killed), at most 10 minutes, then exits."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    def check(status):
        # Defined in here so that Spark ships it by value: the workers need not import this module.
        import os
        import time

        if status != HANG_MARKER:
            return status
        flag = os.environ.get(FLAG_ENV)
        if flag:
            with open(flag, "w") as f:
                f.write(str(os.getpid()))
        parent, deadline = os.getppid(), time.monotonic() + 600
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.2)
        os._exit(1)

    return df.withColumn("status", F.udf(check, StringType())(F.col("status")))
