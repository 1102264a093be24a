"""A transform that fails on a batch holding two particular messages together, and on neither alone:
no single message explains the failure (say, a check across rows). Used by the Kafka test that a run
failing on its batch is counted as an attempt, so that the range is halved until it commits."""

from deltadrain.dev.produce import event_id

PAIR = (event_id(87, 10), event_id(87, 80))


def fails_on_a_pair(df):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    together = F.sum(F.col("event_id").isin(*PAIR).cast("int")).over(Window.partitionBy(F.lit(1)))
    return df.withColumn("status", F.when(together >= 2, F.raise_error(F.lit("the pair is in one batch")))
                         .otherwise(F.col("status")))
