#!/usr/bin/env bash
# SFT then GRPO on GSM8K, CPU (2 cores, no GPU, no model hub needed): SmolLM2-135M-Instruct is fine-tuned on the
# reference solutions (30 SFT steps of 16 conversations), exported, then trained with the quickstart's GRPO recipe
# from the exported folder. Numbers measured with the SFT half: docs/recipes.md, "SFT then GRPO".
# Extra arguments go to the GRPO run (`rlkit train grpo`), e.g. trainer.total_training_steps=4.
set -euo pipefail
cd "$(dirname "$0")/.."
RLKIT=${RLKIT:-.venv/bin/rlkit}
DATA=${RLKIT_DATA_DIR:-$HOME/data/gsm8k_sft}
SFT_CKPT=${SFT_CKPT:-checkpoints/gsm8k_sft/smollm2}
SFT_MODEL=${SFT_MODEL:-models/smollm2-135m-gsm8k-sft}
if [[ ! -f "$DATA/train.parquet" || ! -f "$DATA/test.parquet" ]]; then
  "$RLKIT" data gsm8k --format sft --out "$DATA"   # RL rows + `messages`: one file for SFT, eval and GRPO
fi
"$RLKIT" model pull smollm2-135m-instruct
"$RLKIT" train sft model.path=smollm2-135m-instruct \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" data.val_max_samples=64 \
  data.train_batch_size=16 data.max_length=512 data.truncation=right model.enable_gradient_checkpointing=false \
  optim.lr=1e-5 optim.lr_warmup_steps=2 trainer.total_training_steps=30 trainer.default_local_dir="$SFT_CKPT"
"$RLKIT" export "$SFT_CKPT" "$SFT_MODEL" --force
"$RLKIT" train grpo --config recipes/gsm8k_cpu_quickstart.yaml actor_rollout_ref.model.path="$SFT_MODEL" \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  trainer.experiment_name=smollm2_gsm8k_sft_grpo trainer.default_local_dir=checkpoints/quickstart_sft_grpo "$@"
