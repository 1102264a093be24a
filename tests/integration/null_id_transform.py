"""A transform with a bug: it loses the id of some messages (those whose customer ends in 7)."""


def lose_some_ids(df):
    from pyspark.sql import functions as F

    return df.withColumn("event_id", F.when(F.col("customer").endswith("7"), F.lit(None)).otherwise(F.col("event_id")))
