"""The typed schema of preference runs (`rlkit train dpo`): the SFT schema (sft_schema.py: data, model, engine, optim,
trainer in verl's SFT key names) plus a `dpo:` section in TRL's DPOConfig names, meanings and defaults (verl has no
DPO trainer). A data file holds preference pairs (rlkit.data.preference_schema), not conversations.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.schema import f
from rlkit.config.sft_schema import SFTConfig


@dataclass
class DPORefConfig:
    model_path: str | None = f(None, "the frozen reference model (folder, hub id or alias); null = model.path, the "
                               "policy's start. With LoRA (model.lora_rank > 0) the reference is the base model: the "
                               "policy with its adapter off, so this must stay null")
    precompute: bool = f(False, "score every training and validation pair with the reference once, before step 1 (and "
                         "again at each start or resume), keep its completion log-probs (8 bytes per pair, on the "
                         "driver) and free the reference's weights in every worker: no reference forward per step and "
                         "one model less in memory, for one pass over the data up front (TRL's "
                         "precompute_ref_log_probs). With LoRA it saves the forward only (the base weights are the "
                         "policy's)")


@dataclass
class DPOSection:
    loss_type: str = f("sigmoid", "preference loss (TRL's names): sigmoid (DPO; conservative DPO with "
                       "label_smoothing) | ipo | hinge | robust")
    beta: float = f(0.1, "inverse temperature of the implicit reward beta x log(pi/ref): higher stays closer to "
                    "the reference")
    label_smoothing: float = f(0.0, "assumed rate of flipped preference labels (sigmoid: conservative DPO, robust: "
                               "its unbiased correction; < 0.5)")
    rpo_alpha: float | None = f(None, "weight of the chosen completions' NLL added to the loss (RPO); null = none")
    max_prompt_length: int = f(512, "prompt tokens kept (cut on the left); the completion gets data.max_length "
                               "minus the prompt")
    ref: DPORefConfig = f(factory=DPORefConfig, help="the frozen reference policy")


@dataclass
class DPOConfig(SFTConfig):
    dpo: DPOSection = f(factory=DPOSection, help="the preference loss and its reference model")
