"""The `rlkit` command line."""
