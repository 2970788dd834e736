"""verl's checkpoint.save_contents / load_contents on a trained role: what a checkpoint holds (the optimizer state,
the LR schedule) and what a resume loads follow them; the rest starts fresh. strict and hf_model say their line."""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp

from rlkit.config.checkpoint_contents import CheckpointContents
from rlkit.config.fsdp import FSDPConfig
from rlkit.config.optim import OptimConfig
from rlkit.errors import UserError
from rlkit.testing import save_tiny_model
from rlkit.trainer.run.run_config import load_config
from rlkit.workers.fsdp_model import FSDPModel
from rlkit.workers.trainable import TrainableModelRole

HF = ["actor_rollout_ref.rollout.name=hf"]
CK = "actor_rollout_ref.actor.checkpoint"


class Role(TrainableModelRole):
    def __init__(self, path, contents: CheckpointContents, lr: float) -> None:
        self.model = FSDPModel(str(path), FSDPConfig(param_dtype="float32"), torch.device("cpu"))
        self.model.setup_optimizer(OptimConfig(lr=lr, lr_scheduler_type="cosine"), total_steps=10)
        self.checkpoint_contents = contents

    def step(self) -> None:
        loss = self.model.module(input_ids=torch.arange(1, 9).reshape(1, 8)).logits.float().pow(2).mean()
        loss.backward()
        self.model.optimizer.step()
        self.model.optimizer.zero_grad()
        self.model.scheduler.step()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny", heads=2)


def _optim_entries(path) -> list[str]:
    meta = dcp.FileSystemReader(str(path)).read_metadata()
    return [k for k in meta.state_dict_metadata if k.startswith("optim")]


def test_save_contents_decides_what_the_checkpoint_holds(model_path, tmp_path):
    role = Role(model_path, CheckpointContents(save_contents=["model"]), lr=1e-2)
    role.step()
    role.save_checkpoint(str(tmp_path / "slim"))
    assert _optim_entries(tmp_path / "slim") == [] and not (tmp_path / "slim" / "scheduler.pt").exists()
    role.checkpoint_contents = CheckpointContents()
    role.save_checkpoint(str(tmp_path / "full"))
    assert _optim_entries(tmp_path / "full") and (tmp_path / "full" / "scheduler.pt").exists()


def test_load_contents_leaves_the_rest_fresh(model_path, tmp_path):
    saved = Role(model_path, CheckpointContents(), lr=1e-2)
    for _ in range(3):
        saved.step()
    saved.save_checkpoint(str(tmp_path / "ckpt"))
    resumed = Role(model_path, CheckpointContents(load_contents=["model"]), lr=1e-2)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    for a, b in zip(saved.model.module.parameters(), resumed.model.module.parameters(), strict=True):
        assert torch.equal(a, b)  # the weights are the checkpoint's
    assert not resumed.model.optimizer.state and resumed.model.scheduler.last_epoch == 0  # optimizer, schedule: fresh
    whole = Role(model_path, CheckpointContents(), lr=1e-2)
    whole.load_checkpoint(str(tmp_path / "ckpt"))
    assert whole.model.optimizer.state and whole.model.scheduler.last_epoch == 3


def test_the_config_reads_verls_keys():
    cfg = load_config("grpo", HF + [f"{CK}.save_contents=[model,optimizer]", f"{CK}.load_contents=[model]",
                                    "critic.checkpoint.save_contents=[model,optimizer,extra]"])
    ck = cfg.actor_rollout_ref.actor.checkpoint
    assert ck.save_contents == ["model", "optimizer"] and ck.load_contents == ["model"]
    notices: list[str] = []
    cfg = load_config("grpo", HF + [f"{CK}.save_contents=[model,optimizer,extra,hf_model]", f"{CK}.strict=false"],
                      notices=notices)
    assert cfg.actor_rollout_ref.actor.checkpoint.save_contents == ["model", "optimizer", "extra"]
    said = "\n".join(notices)
    assert "hf_model is `rlkit export CKPT`" in said and "checkpoint.strict=false -> nothing to set" in said
    only_hf = load_config("grpo", HF + [f"{CK}.save_contents=[hf_model]"])  # verl: the weights, as an HF folder
    assert only_hf.actor_rollout_ref.actor.checkpoint.save_contents == ["model"]
    with pytest.raises(UserError, match="leaves out the model"):
        load_config("grpo", HF + [f"{CK}.save_contents=[optimizer]"])
    with pytest.raises(UserError, match="load_contents names optimizer, which .* does not save"):
        load_config("grpo", HF + [f"{CK}.save_contents=[model]", f"{CK}.load_contents=[model,optimizer]"])
