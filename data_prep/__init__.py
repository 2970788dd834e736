"""Dataset preparation for `rlkit data NAME`: one module per dataset (gsm8k, math, toy).

Each module turns its source records into rows of the common RL schema
(`rlkit.data.schema`) and writes train/test parquet through `data_prep.runner`;
`data_prep.registry.load_datasets()` finds them all.
"""
