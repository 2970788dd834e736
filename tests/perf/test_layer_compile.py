"""`actor_rollout_ref.model.use_torch_compile` (rlkit/workers/layer_compile.py): compiled decoder layers give
the eager path's log-probs, entropy, loss and gradients, packed and padded, and every layer and every
micro-batch length reuses one compiled graph (no recompile per layer or per shape)."""

from __future__ import annotations

import pytest

from rlkit.config.schema import FSDPConfig
from rlkit.testing import save_tiny_model
from rlkit.workers.fsdp_model import FSDPModel
from tests.perf.test_forward_equivalence import handmade_batch, run


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("compile") / "tiny", heads=2, tie_embeddings=True)


def test_compiled_layers_match_eager_and_compile_once(model_path):
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # count this test's graphs only, whatever ran before in this process
    eager = FSDPModel(str(model_path), FSDPConfig(), torch.device("cpu"))
    compiled = FSDPModel(str(model_path), FSDPConfig(), torch.device("cpu"), compile_layers=True)
    assert dict(compiled.module.named_parameters()).keys() == dict(eager.module.named_parameters()).keys()
    frames = torch._dynamo.utils.counters["stats"]
    for seed, remove_padding in ((0, True), (1, True), (2, False), (3, False)):  # new lengths every call
        batch = handmade_batch(seed)
        keep = 3 + seed  # fewer rows: another packed length / padded width
        batch = {k: v[:keep] for k, v in batch.items()}
        want = run(eager, batch, remove_padding=remove_padding, response_logits_only=True, chunk_size=1024)
        got = run(compiled, batch, remove_padding=remove_padding, response_logits_only=True, chunk_size=1024)
        torch.testing.assert_close(got[0], want[0], atol=1e-5, rtol=0)  # log-probs
        torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=0)  # entropy
        torch.testing.assert_close(got[2], want[2], atol=1e-6, rtol=1e-5)  # loss
        scale = max(g.abs().max() for g in want[3].values())
        for name, grad in want[3].items():
            torch.testing.assert_close(got[3][name], grad, atol=1e-4 * scale, rtol=0, msg=name)
    # one graph per compiled region for both layers and all four shapes; packed and padded rows take
    # different branches (varlen break vs a 2-D mask), so at most two sets of regions
    assert 0 < frames["unique_graphs"] <= 8, dict(frames)


def test_the_compile_cache_lives_in_rlkits_cache_unless_torchs_is_set(monkeypatch, tmp_path):
    from rlkit.workers.layer_compile import inductor_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("RLKIT_CACHE_DIR", str(tmp_path))
    assert inductor_cache_dir() == tmp_path / "inductor"
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")  # what inductor reads when it compiles
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert inductor_cache_dir() == tmp_path / "mine"


def test_auto_compiles_models_of_50m_parameters_and_up():
    import torch

    from rlkit.config.schema import ModelConfig
    from rlkit.workers.layer_compile import AUTO_MIN_PARAMS, wanted

    small, big = torch.nn.Linear(8, 8), torch.nn.Linear(8000, 6500, bias=False, device="meta")
    assert sum(p.numel() for p in big.parameters()) >= AUTO_MIN_PARAMS
    assert (wanted("auto", small), wanted("auto", big)) == (False, True)
    assert (wanted(True, small), wanted(False, big)) == (True, False)
    assert ModelConfig().use_torch_compile == "auto"
    from rlkit.errors import UserError

    with pytest.raises(UserError, match="use_torch_compile='yes'"):
        ModelConfig(use_torch_compile="yes")
