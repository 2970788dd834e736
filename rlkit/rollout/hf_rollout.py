"""`hf` rollout backend: transformers `generate` on a private, unsharded copy of the model.

Always available (no vLLM needed): the fallback on machines without vLLM and
the reference the vLLM backend is tested against. Token-in/token-out: prompts
arrive as left-padded ids and responses leave as ids; nothing is re-tokenised.

Sampling is done by our own logits-processor chain (temperature -> top-k ->
top-p, the order vLLM uses) so that `rollout_log_probs` are exactly
`log_softmax` of the scores the token was drawn from: the temperature-scaled,
top-k/top-p-truncated and renormalised distribution (greedy: the raw model
distribution). The vLLM backend returns the same quantity. A vision-language model's image/video pad tokens
are never sampled (they stand for image features, in prompts only), so its `rollout_log_probs` are of the
distribution without them: the trainer's full-vocabulary log-probs plus -log(1 - p(pads)), nil for a trained
VLM, which gives them no mass.

For MoE routing replay (`sampling.return_routed_experts`, set by `actor.router_replay`) it records the experts
every router chose for each prompt and response token (`routed_experts` (B, P+R, layers, k) int16, aligned with
`input_ids`, -1 where no token was routed: padding, and a response's last token when generation stopped there,
as it was never fed back; its route cannot change any log-prob).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import torch

from rlkit.config.rollout import RolloutConfig
from rlkit.controller.worker import pick_device
from rlkit.data.images import MODEL_INPUTS
from rlkit.models.model_info import WeightNames, special_token_ids, torch_dtype
from rlkit.models.moe_router import RouteRecorder
from rlkit.models.vision import batch_images, causal_lm_class, placeholder_token_ids, uses_rope_positions
from rlkit.protocol import Batch
from rlkit.rollout.base import ROLLOUT_BACKENDS, RolloutBackend, SamplingConfig, assemble_output, engine_dtype
from rlkit.utils.memory_peak import rss_bytes

GREEDY_EPS = 1e-5  # temperatures below this decode greedily (as vLLM does)


class _Suppress:
    """First logits processor of a VLM: its image/video pad tokens cannot be sampled (rlkit/models/vision.py)."""

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_ids

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores[:, self.token_ids] = -float("inf")
        return scores


class _LogProbRecorder:
    """Last logits processor: remembers log_softmax of the final scores and gathers the chosen token
    one step later (when it appears in input_ids). Memory O(batch x vocab), not O(steps x batch x vocab)."""

    def __init__(self) -> None:
        self.values: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._pending is not None:
            self.values.append(self._pending.gather(1, input_ids[:, -1:]).squeeze(1))
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """(b, L) log-probs of `generated` (the new tokens); steps generate undid are dropped."""
        length = generated.shape[1]
        if len(self.values) < length and self._pending is not None:
            self.values.append(self._pending.gather(1, generated[:, len(self.values)].unsqueeze(1)).squeeze(1))
        self._pending = None
        if length == 0:
            return torch.zeros(generated.shape, dtype=torch.float32)
        return torch.stack(self.values[:length], dim=1)


def stop_mask(tokens: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """1 up to and including the first stop token of each row, 0 after it."""
    is_stop = torch.isin(tokens, torch.tensor(stop_ids, dtype=tokens.dtype, device=tokens.device))
    stops_before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
    return (stops_before == 0).long()


def place_routes(out: torch.Tensor, calls: list[torch.Tensor], prompt_mask: torch.Tensor, keep: torch.Tensor) -> None:
    """Lay one micro-batch's recorded routes into `out` (b, P+R, layers, k), in place: the prefill covers the last
    columns of the prompt (generate saw the prompt without its all-padding leading columns), decode step t
    fed response token t-1; -1 stays where no real token was routed (padding, tokens after the stop)."""
    b, prompt_len = prompt_mask.shape
    n = keep.shape[1]
    if len(calls) != n or calls[0].shape[0] % b or any(c.shape[0] != b for c in calls[1:]):
        raise RuntimeError(
            f"routing record: {len(calls)} forwards ({[c.shape[0] for c in calls[:3]]} tokens) for "
            f"{b} rows and {n} new tokens; expected one prefill and one forward per decode step"
        )
    fed = calls[0].shape[0] // b
    out[:, prompt_len - fed : prompt_len] = calls[0].view(b, fed, *calls[0].shape[1:])
    for t, call in enumerate(calls[1:]):
        out[:, prompt_len + t] = call
    out[:, :prompt_len][~prompt_mask.bool()] = -1
    out[:, prompt_len : prompt_len + n][~keep.bool()] = -1


@ROLLOUT_BACKENDS.register("hf")
class HFRollout(RolloutBackend):
    """transformers `generate`, micro-batched by `config.max_num_seqs`, on `device` (the worker's; None: this
    process's, `pick_device`: its GPU where it sees one, as a CPU engine on a GPU node is 10-100x slower)."""

    returns_routed_experts = True
    takes_device = True  # the rollout worker passes its device (a GPU worker's engine generates on its GPU)

    def __init__(
        self,
        model_path: str | Path,
        config: RolloutConfig,
        tokenizer=None,
        device: str | torch.device | None = None,
    ) -> None:
        import transformers
        from transformers import AutoConfig, GenerationConfig

        self.config = config
        self.device = torch.device(device) if device is not None else pick_device()
        self.stop_ids, self.pad_id = special_token_ids(model_path, tokenizer)
        self.dtype = engine_dtype(config.dtype, on_gpu=self.device.type == "cuda")
        auto = getattr(transformers, causal_lm_class(AutoConfig.from_pretrained(str(model_path))))
        model = auto.from_pretrained(str(model_path), dtype=torch_dtype(self.dtype))
        # A clean generation config: checkpoint defaults (repetition penalty, top_k=50, ...) must not leak
        # into RL sampling; only what SamplingConfig says applies.
        model.generation_config = GenerationConfig(eos_token_id=self.stop_ids, pad_token_id=self.pad_id)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.weight_names = WeightNames(self.model)
        self.suppressed = placeholder_token_ids(self.model.config)
        self.route_recorder = RouteRecorder.attach(self.model)  # None for a dense model
        self._rng = torch.Generator().manual_seed(config.seed)
        self.last_update: dict[str, float] = {}

    # ----------------------------------------------------------------- generate
    def generate(self, prompts: Batch, sampling: SamplingConfig) -> Batch:
        rows = len(prompts)
        length = sampling.response_length
        responses = torch.full((rows, length), self.pad_id, dtype=torch.long)
        mask = torch.zeros((rows, length), dtype=torch.long)
        log_probs = torch.zeros((rows, length), dtype=torch.float32) if sampling.calculate_log_probs else None
        stop_ids = sampling.stops(self.stop_ids)
        routes = self._empty_routes(prompts, length) if sampling.return_routed_experts else None
        seed = sampling.seed if sampling.seed is not None else int(torch.randint(2**62, (1,), generator=self._rng))
        step = self.config.max_num_seqs
        images = prompts.non_tensors.get(MODEL_INPUTS)  # a vision-language batch: each row's processor output
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(seed)
            for start in range(0, rows, step):
                part = slice(start, min(start + step, rows))
                ids, lps, calls = self._generate_part(
                    prompts.tensors["input_ids"][part],
                    prompts.tensors["attention_mask"][part],
                    sampling,
                    stop_ids,
                    record_routes=routes is not None,
                    images=batch_images(images[part] if images is not None else None, self.model.config),
                )
                keep = stop_mask(ids, stop_ids)
                n = ids.shape[1]
                responses[part, :n] = torch.where(keep.bool(), ids, self.pad_id)
                mask[part, :n] = keep
                if log_probs is not None:
                    log_probs[part, :n] = torch.where(keep.bool(), lps, 0.0)  # -inf * 0 would be nan
                if routes is not None:
                    place_routes(routes[part], calls, prompts.tensors["attention_mask"][part], keep)
        out = assemble_output(prompts, responses, mask, log_probs)
        if routes is not None:
            out["routed_experts"] = routes
        return out

    def _empty_routes(self, prompts: Batch, response_length: int) -> torch.Tensor:
        if self.route_recorder is None:
            raise ValueError(
                "return_routed_experts (actor.router_replay) needs a mixture-of-experts model; "
                f"{self.model.config.model_type} has no router"
            )
        rec = self.route_recorder
        rows, prompt_len = prompts.tensors["input_ids"].shape
        return torch.full((rows, prompt_len + response_length, len(rec.routers), rec.top_k), -1, dtype=torch.int16)

    def _generate_part(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        sampling: SamplingConfig,
        stop_ids: list[int],
        record_routes: bool = False,
        images: dict[str, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
        """Generate for one micro-batch; returns (new tokens (b, L<=R) on CPU, their log-probs or None, the
        routes of each forward (`RouteRecorder.take`; empty unless `record_routes`)). `images`: the rows'
        pixel patches and grids joined in row order (rlkit/models/vision.py), for a vision-language model."""
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        # drop leading columns that are padding for every row of this micro-batch
        used = attention_mask.bool().any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        input_ids = input_ids[:, first:].to(self.device)
        attention_mask = attention_mask[:, first:].to(self.device)
        greedy = sampling.greedy or sampling.temperature < GREEDY_EPS
        processors = LogitsProcessorList([_Suppress(self.suppressed)] if self.suppressed else [])
        if not greedy:
            if sampling.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_k > 0:
                processors.append(TopKLogitsWarper(sampling.top_k))
            if sampling.top_p < 1.0:
                processors.append(TopPLogitsWarper(sampling.top_p))
        recorder = _LogProbRecorder() if sampling.calculate_log_probs else None
        if recorder is not None:
            processors.append(recorder)
        extra = {} if greedy else {"temperature": 1.0, "top_k": 0, "top_p": 1.0}  # sampling done by `processors`
        if images:  # which tokens are image pads: the model places its 3-D rotary positions from them
            extra.update({k: v.to(self.device) for k, v in images.items()})
            if uses_rope_positions(self.model):
                extra["mm_token_type_ids"] = (input_ids == self.model.config.image_token_id).int()
        recording = self.route_recorder.recording() if record_routes else contextlib.nullcontext()
        with recording:
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=sampling.response_length,
                do_sample=not greedy,
                eos_token_id=stop_ids,
                pad_token_id=self.pad_id,
                logits_processor=processors,
                **extra,
            )
        new = out[:, input_ids.shape[1] :].cpu()
        calls = [c.cpu() for c in self.route_recorder.take()] if record_routes else []
        return new, (recorder.finish(new.to(self.device)).cpu() if recorder is not None else None), calls

    # ------------------------------------------------------------- weight sync
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copy full HF-named tensors into the private model, tensor by tensor (strict names and shapes)."""
        params = self.model.state_dict(keep_vars=True)
        stream = self.weight_names.stream(named_tensors)
        with torch.no_grad():
            for name, tensor in stream:
                params[name].data.copy_(tensor)
        self.last_update = stream.finish()
        return int(self.last_update["bytes"])

    def _release(self, level: int | None) -> None:
        """On GPU, park the weights in host memory between rollouts (any level); on CPU nothing to free."""
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def _restore(self, parts: list[str]) -> None:
        if self.device.type == "cuda" and "weights" in parts:
            self.model.to(self.device)

    def memory_parts(self) -> dict[str, float]:
        """GB of the engine's model copy (host memory on CPU at any level; parked there on GPU while asleep).
        It has no KV cache of its own between calls (`generate` builds one per call)."""
        return {"weights_gb": sum(p.numel() * p.element_size() for p in self.model.parameters()) / 2**30}

    def memory_report(self) -> dict[str, int]:
        """Process RSS (and CUDA allocated bytes on GPU), for before/after comparisons."""
        report = {"rss_bytes": rss_bytes()}
        if self.device.type == "cuda":
            report["device_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
        return report
