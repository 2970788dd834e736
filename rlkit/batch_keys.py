"""The tensors that travel between roles in a `Batch`: one declaration each (shape, dtype, producer, consumers).

Shapes use named dimensions: `B` rows (one per sample), `P` the left-padded prompt, `R` the right-padded
response, `S` = P + R, `L` the MoE layers and `K` the experts per token (or the teacher's top-k); a `*` dtype
accepts any of the listed kind. `check_output` compares what a role returned from one call with this table: the
trainer runs it after every worker call in `--debug` mode (or `trainer.debug.check_batch_keys=true`), so a wrong
shape, dtype or a missing key names the role, the call and the key instead of failing three phases later.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlkit.errors import UserError
from rlkit.phases import call_outputs

INT = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
FLOAT32 = (torch.float32,)


@dataclass(frozen=True)
class BatchKey:
    shape: tuple[str, ...]  # named dims, e.g. ("B", "R")
    dtypes: tuple[torch.dtype, ...]  # accepted dtypes
    producer: str  # the role (and call) that writes it
    consumers: str  # who reads it
    meaning: str


def _key(shape: str, dtypes: tuple[torch.dtype, ...], producer: str, consumers: str, meaning: str) -> BatchKey:
    return BatchKey(tuple(shape.split(",")), dtypes, producer, consumers, meaning)


BATCH_KEYS: dict[str, BatchKey] = {
    # the dataset
    "input_ids": _key("B,S", INT, "dataset (B,P), rollout (B,S)", "every model role", "prompt (+ response) token ids"),
    "attention_mask": _key("B,S", INT, "dataset, rollout", "every model role", "1 where a token exists"),
    "position_ids": _key("B,S", INT, "dataset, rollout", "every model role", "positions, 0 at each row's first token"),
    # the rollout engine (rlkit/rollout/base.py assemble_output)
    "prompts": _key("B,P", INT, "rollout.generate_sequences", "reward, metrics", "the prompt ids, left-padded"),
    "responses": _key("B,R", INT, "rollout.generate_sequences", "reward, metrics", "sampled ids, right-padded"),
    "response_mask": _key("B,R", INT, "rollout.generate_sequences", "every loss and metric",
                          "1 on trained response tokens (tool output in multi-turn is 0)"),
    "rollout_log_probs": _key("B,R", FLOAT32, "rollout (calculate_log_probs)", "rollout correction, metrics",
                              "the engine's log p of each sampled token"),
    "routed_experts": _key("B,S,L,K", INT, "rollout (return_routed_experts), or actor.compute_log_prob "
                           "(router_replay_from=old_log_prob)", "actor (router replay)",
                           "the experts each token was routed to, -1 = free"),
    "policy_version": _key("B", INT, "fully async rollout", "staleness metrics",
                           "the version of a sample's first token"),
    "token_policy_version": _key("B,R", INT, "fully async rollout", "staleness metrics",
                                 "the policy version that sampled each token, -1 on padding"),
    # the reward stage
    "token_level_scores": _key("B,R", FLOAT32, "reward manager", "reward shaping",
                               "each row's score on its last valid response token"),
    "rm_scores": _key("B,R", FLOAT32, "reward_model.compute_rm_score", "reward mix", "the RM's score, placed the same"),
    "reward_baselines": _key("B", FLOAT32, "driver (ReMax greedy baseline)", "remax estimator",
                             "the greedy response's score per row"),
    # the model roles
    "old_log_probs": _key("B,R", FLOAT32, "actor.compute_log_prob", "policy loss, KL in reward",
                          "the behaviour policy's log p (before this step's update)"),
    "entropys": _key("B,R", FLOAT32, "actor.compute_log_prob", "metrics", "per-token entropy of the policy"),
    "sum_pi_squared": _key("B,R", FLOAT32, "actor.compute_log_prob (when the estimator @needs(sum_pi_squared))",
                           "advantage stage (optimal token baselines)",
                           "sum over the vocabulary of pi^2 at each token, at the sampling temperature"),
    "ref_log_prob": _key("B,R", FLOAT32, "ref.compute_ref_log_prob", "KL loss / KL in reward", "the reference's log p"),
    "values": _key("B,R", FLOAT32, "critic.compute_values", "GAE, value loss", "the critic's value per token"),
    # distillation (rlkit/trainer/step/teacher_stage.py)
    "teacher_log_probs": _key("B,R", FLOAT32, "teacher.compute_teacher_log_prob (aligned by the driver)",
                              "distillation loss", "the teacher's log p of each sampled token"),
    "teacher_mask": _key("B,R", FLOAT32, "driver (teacher stage)", "distillation loss",
                         "1 where the teacher scored the token (0: failed request, no teacher, no aligned text)"),
    "teacher_topk_ids": _key("B,R,K", INT, "teacher.compute_teacher_log_prob", "distillation loss (forward_kl_topk)",
                             "the teacher's K most likely token ids per position"),
    "teacher_topk_log_probs": _key("B,R,K", FLOAT32, "teacher.compute_teacher_log_prob",
                                   "distillation loss (forward_kl_topk)", "their log-probs under the teacher"),
    # the driver's advantage stage
    "token_level_rewards": _key("B,R", FLOAT32, "driver (shape_rewards)", "advantage estimators",
                                "scores minus the in-reward KL penalty"),
    "advantages": _key("B,R", FLOAT32, "driver (compute_advantages)", "policy loss", "per-token advantage"),
    "returns": _key("B,R", FLOAT32, "driver (compute_advantages)", "value loss", "per-token return target"),
}

#: what each worker call must return (the rollout's list is the minimum: it may add declared keys); declared with
#: the call's phase in rlkit/phases.py
CALL_OUTPUTS: dict[str, tuple[str, ...]] = call_outputs()


def check_output(role: str, call: str, out: object, rows: int, response_length: int | None) -> None:
    """Raise a `UserError` naming `role.call` and the key when `out` (a Batch) disagrees with `BATCH_KEYS`:
    a missing required key, an undeclared dim size (`B` = `rows`, `R` = `response_length` when known) or dtype."""
    tensors = getattr(out, "tensors", None)
    if tensors is None:
        return
    where = f"{role}.{call}"
    missing = [k for k in CALL_OUTPUTS.get(call, ()) if k not in tensors]
    if missing:
        raise UserError(f"batch keys: {where} returned no {missing} (rlkit/batch_keys.py CALL_OUTPUTS)")
    if call == "generate_sequences" and "responses" in tensors:
        response_length = tensors["responses"].shape[1]
    sizes = {"B": rows, "R": response_length}
    for name, tensor in tensors.items():
        spec = BATCH_KEYS.get(name)
        if spec is None:
            continue  # a role may carry extras (metrics tensors, plugins); only the declared ones are contracts
        if tensor.dim() != len(spec.shape):
            raise UserError(f"batch keys: {where} returned '{name}' with shape {tuple(tensor.shape)}, "
                            f"declared ({', '.join(spec.shape)})")
        for dim, size in zip(spec.shape, tensor.shape, strict=True):
            want = sizes.get(dim)
            if want is not None and size != want:
                raise UserError(f"batch keys: {where} returned '{name}' with shape {tuple(tensor.shape)}: "
                                f"{dim} is {size}, expected {want} (declared ({', '.join(spec.shape)}))")
        if tensor.dtype not in spec.dtypes:
            raise UserError(f"batch keys: {where} returned '{name}' as {tensor.dtype}, declared "
                            f"{' | '.join(str(d).removeprefix('torch.') for d in spec.dtypes)}")
