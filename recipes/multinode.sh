#!/usr/bin/env bash
# Multi-node launch. Hardware: 2+ nodes with the same Python env and a shared filesystem for checkpoints.
#   head node:    rlkit cluster up --node-ip 10.0.0.1 --num-gpus 8   (on the network, Ray's token auth on;
#                 it prints the token file, 0600: copy it to each worker; docs/multinode.md)
#   each worker:  rlkit cluster join 10.0.0.1:6379 --token-file ~/head_token --num-gpus 8
#   head node:    bash recipes/multinode.sh 10.0.0.1:6379
#   engines on nodes of their own (one-step-off, weights broadcast from the actor's rank 0, no object store):
#                 ENGINE_NODES=1 bash recipes/multinode.sh 10.0.0.1:6379   (needs NNODES + 1 nodes)
# Expected: `rlkit cluster status` shows every node; ranks are placed one bundle set per node in a stable order
# (each rank's node in <default_local_dir>/status.json); every node must see /shared (checked before loading).
set -euo pipefail
ADDRESS=${1:?usage: multinode.sh HEAD_ADDRESS [overrides...]}
shift
NNODES=${NNODES:-2}
N_GPUS=${N_GPUS:-8}
ENGINE_NODES=${ENGINE_NODES:-0}
EXTRA=()
if [ "$ENGINE_NODES" -gt 0 ]; then
  EXTRA=(trainer.one_step_off_policy=true actor_rollout_ref.rollout.nnodes="$ENGINE_NODES"
         actor_rollout_ref.rollout.n_gpus_per_node="$N_GPUS")
fi
rlkit train grpo --address "$ADDRESS" \
  data.train_files=~/data/gsm8k/train.parquet data.val_files=~/data/gsm8k/test.parquet \
  actor_rollout_ref.model.path=Qwen/Qwen3-0.6B actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.dtype=bfloat16 actor_rollout_ref.actor.fsdp_config.param_dtype=bfloat16 \
  trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$N_GPUS" trainer.device=cuda \
  trainer.default_local_dir=/shared/checkpoints/gsm8k_multinode "${EXTRA[@]}" "$@"
