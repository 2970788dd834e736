"""`rlkit debug replay`: the recorded steps and their replay in one process."""
