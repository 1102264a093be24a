"""A transform that filters: orders of a single item are not wanted in the target."""


def drop_single_items(df):
    from pyspark.sql import functions as F

    return df.where(F.col("quantity") != F.lit(1))
