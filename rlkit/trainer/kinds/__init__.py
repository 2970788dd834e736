"""The trainer kinds besides RL: SFT and DPO (their trainers and launchers)."""
