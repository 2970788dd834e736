"""Export a sharded actor checkpoint as a plain HF folder (merging a LoRA adapter into its base), in one process.

Kept apart from rlkit/workers/fsdp_model.py (which re-exports `export_hf`): it runs without a process
group or a cluster (`rlkit train export`, the evaluator).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from rlkit.models.lora import (
    ADAPTER_NAME,
    adapter_state_dict,
    peft_config_from_dict,
    read_lora_info,
    save_adapter_folder,
)

PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "chat_template.jinja")


def export_hf(
    checkpoint_actor_dir: Path, out_dir: Path, tokenizer_dir: Path | None = None, adapter_only: bool = False
) -> Path:
    """Turn a sharded actor checkpoint into a plain HF folder, in one process (no cluster needed).

    A LoRA checkpoint (it holds the adapter only) is merged into its base model; `adapter_only`
    writes the PEFT adapter folder instead (`PeftModel.from_pretrained(base, out_dir)` loads it)."""
    import torch.distributed.checkpoint as dcp
    import transformers
    from transformers import AutoConfig

    from rlkit.models.vision import causal_lm_class

    lora_info = read_lora_info(checkpoint_actor_dir)
    if adapter_only and lora_info is None:
        raise ValueError(
            f"{checkpoint_actor_dir} is a full fine-tuning checkpoint: it has no adapter to export "
            "(drop --adapter-only)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    if lora_info is not None:
        export_lora(checkpoint_actor_dir, out_dir, lora_info, adapter_only)
    else:
        config = AutoConfig.from_pretrained(checkpoint_actor_dir / "hf_config")
        auto = getattr(transformers, causal_lm_class(config))  # a VLM's is the image-text class
        model = auto.from_config(config, dtype=torch.float32)
        state = {"model": model.state_dict()}
        dcp.load(state, checkpoint_id=str(checkpoint_actor_dir), no_dist=True)
        model.load_state_dict(state["model"])
        model.save_pretrained(out_dir)
    if tokenizer_dir is not None and tokenizer_dir.exists():
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
        for name in PROCESSOR_FILES:  # a VLM's processor, saved beside the tokenizer by the trainer
            if (tokenizer_dir / name).is_file():
                shutil.copyfile(tokenizer_dir / name, out_dir / name)
    return out_dir


def export_lora(checkpoint_actor_dir: Path, out_dir: Path, lora_info: dict, adapter_only: bool) -> None:
    """The adapter of a LoRA checkpoint on its base model (`lora.json` names both): merged HF folder, or the
    PEFT adapter folder alone."""
    import torch.distributed.checkpoint as dcp
    import transformers
    from peft import get_peft_model
    from transformers import AutoConfig

    from rlkit.models.vision import causal_lm_class

    base = lora_info["base_model"]
    if not Path(base).is_dir():
        raise ValueError(
            f"the checkpoint's base model {base} is not a folder here; the LoRA checkpoint holds only "
            "the adapter, so export needs the base it was trained on"
        )
    auto = getattr(transformers, causal_lm_class(AutoConfig.from_pretrained(base)))
    model = auto.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, peft_config_from_dict(lora_info["peft_config"]))
    adapter = {k: v for k, v in model.state_dict().items() if ".lora_" in k}
    state = {"model": adapter}
    dcp.load(state, checkpoint_id=str(checkpoint_actor_dir), no_dist=True)
    missing = set(adapter) - set(state["model"])
    if missing:
        raise ValueError(f"adapter tensors missing from the checkpoint: {sorted(missing)[:4]}")
    model.load_state_dict(state["model"], strict=False)
    if adapter_only:
        save_adapter_folder(
            out_dir, peft_model.peft_config[ADAPTER_NAME], adapter_state_dict(adapter.items()), base_model=base
        )
    else:
        peft_model.merge_and_unload().save_pretrained(out_dir)
