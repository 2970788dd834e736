#!/usr/bin/env bash
# On-policy distillation on 2 CPU cores, nothing downloaded (docs/distillation.md): the toy copy task
# ("copy the digits : 7" -> "7"), a tiny teacher trained in a few seconds to solve it (rlkit.testing) and a random
# student of the same shape, `rlkit train distill` with the top-8 forward KL and no task reward.
# Expected (bench/distill_curve.py, 30 steps): greedy validation 0.0 -> 1.0 (the teacher's), the per-token KL to the
# teacher from ~3.4 to ~0.3. Extra arguments go to `rlkit train`, e.g. distillation.distillation_loss.loss_mode=k3.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
RLKIT=${RLKIT:-.venv/bin/rlkit}
WORK=${RLKIT_DISTILL_DIR:-checkpoints/distill_toy}
"$RLKIT" data toy --out "$WORK/data" --length 1
"$PY" -c "import sys; from rlkit.testing import save_tiny_model, save_toy_copy_teacher as t; \
t(sys.argv[1] + '/teacher'); save_tiny_model(sys.argv[1] + '/student', tie_embeddings=True)" "$WORK"
"$RLKIT" train distill \
  data.train_files="$WORK/data/train.parquet" data.val_files="$WORK/data/test.parquet" \
  data.max_prompt_length=32 data.max_response_length=3 data.train_batch_size=32 \
  actor_rollout_ref.model.path="$WORK/student" actor_rollout_ref.rollout.name=hf actor_rollout_ref.rollout.n=8 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.actor.optim.lr=5e-3 \
  +distillation.teacher_models.teacher.model_path="$WORK/teacher" \
  distillation.distillation_loss.loss_mode=forward_kl_topk distillation.distillation_loss.topk=8 \
  trainer.total_training_steps=30 trainer.test_freq=10 trainer.n_gpus_per_node=1 trainer.cpus_per_worker=1 \
  trainer.default_local_dir="$WORK/ckpt" trainer.experiment_name=distill_toy "$@"
