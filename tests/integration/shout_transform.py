"""A transform that upper-cases the customer of orders with an odd quantity: a new version of a
handler whose output breaks a CHECK constraint on some rows only. Used by the reprocess test of
rows the target refuses."""


def shout_odd_quantities(df):
    from pyspark.sql import functions as F

    return df.withColumn("customer", F.when(F.col("quantity") % 2 == 1, F.upper(F.col("customer")))
                         .otherwise(F.col("customer")))
