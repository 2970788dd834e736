"""The run config: typed schema, composition (presets, user YAML, overrides), checks, finalize.

The bottom layer: everything imports it, it imports nothing of rlkit but `rlkit.errors`.
What only a higher layer knows reaches `finalize` as hooks (see rlkit/config/finalize.py);
`rlkit.trainer.run.run_config.load_config` is the composition + finalize that `rlkit train` runs.
"""

from rlkit.config.finalize import ConfigHook, finalize
from rlkit.config.load import compose_config, preset_names, schema_keys, to_dict, to_yaml
from rlkit.config.schema import RLConfig

__all__ = ["ConfigHook", "RLConfig", "compose_config", "finalize", "preset_names", "schema_keys", "to_dict", "to_yaml"]
