#!/usr/bin/env bash
# CPU vision-language GRPO: a tiny random Qwen2.5-VL (0.57M parameters, 2 text layers, 2 vision blocks;
# rlkit.testing.save_tiny_vlm) learns to name the colour of the shape that fills a 56x56 picture
# (`rlkit data shapes --questions colour --fill`, exact-match reward, chance 1/4 once it answers with colour
# words): greedy validation 0 -> ~0.77 within ~10 steps, 1.0 later. HF rollout (vLLM 0.32's Qwen2-VL models need
# torchvision, which rlkit does not install: docs/vlm.md). BLANK=1 runs the control on the same rows with
# white images: it stays at chance. NO_IMAGE=1 asks the same questions as text only (the step-time baseline).
# bench/vlm_learning.py runs all three and writes the curves.
# Hardware: 2 CPU cores, ~1 GiB RAM, no GPU, no download. Numbers: docs/vlm.md.
# Extra arguments go to `rlkit train` as overrides, e.g. trainer.total_training_steps=20.
set -euo pipefail
cd "$(dirname "$0")/.."
RLKIT=${RLKIT:-.venv/bin/rlkit}
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/vlm_cpu_shapes}
BLANK=${BLANK:-0}
NO_IMAGE=${NO_IMAGE:-0}
DATA="$OUT/shapes$([ "$BLANK" = 1 ] && echo _blank || true)$([ "$NO_IMAGE" = 1 ] && echo _text || true)"
"$RLKIT" data shapes --out "$DATA" --questions colour --fill --train-size 4096 --test-size 64 -f \
  $([ "$BLANK" = 1 ] && echo --blank || true) $([ "$NO_IMAGE" = 1 ] && echo --no-image || true) > /dev/null
[ -d "$OUT/model" ] || "$PYTHON" -c "import sys; from rlkit.testing import save_tiny_vlm; save_tiny_vlm(sys.argv[1])" \
  "$OUT/model"
"$RLKIT" train grpo \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  data.max_prompt_length=32 data.max_response_length=1 data.train_batch_size=16 \
  actor_rollout_ref.model.path="$OUT/model" actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.rollout.calculate_log_probs=true \
  actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64 \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64 actor_rollout_ref.actor.optim.lr=1e-3 \
  trainer.total_training_steps=80 trainer.val_before_train=true trainer.test_freq=10 trainer.save_freq=-1 \
  trainer.n_gpus_per_node=1 trainer.cpus_per_worker=1 trainer.resume_mode=disable \
  trainer.project_name=vlm_shapes trainer.experiment_name="colour_blank${BLANK}_text$NO_IMAGE" \
  trainer.default_local_dir="$OUT/ckpt" trainer.logger=[console,file] "$@"
