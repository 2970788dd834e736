"""verl's optimizer keys do what verl does with them: the class named by optimizer_impl.optimizer, built with lr,
weight_decay, betas (Adam-like names) and override_optimizer_config; min_lr floors the cosine schedule."""

from __future__ import annotations

import pytest
import torch

from rlkit.config.optim import OptimConfig, settle_optim
from rlkit.errors import UserError
from rlkit.trainer.run.run_config import load_config
from rlkit.utils.lr_schedule import lr_lambda
from rlkit.utils.optimizer import build_optimizer

HF = ["actor_rollout_ref.rollout.name=hf"]
A = "actor_rollout_ref.actor.optim"


def test_override_optimizer_config_reaches_the_optimizer_class():
    cfg = load_config("grpo", HF + [f"{A}.optimizer=Adam", f"{A}.betas=[0.5,0.6]",
                                    f"+{A}.override_optimizer_config.eps=0.001",
                                    f"+{A}.override_optimizer_config.amsgrad=true"])
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], cfg.actor_rollout_ref.actor.optim)
    assert type(opt) is torch.optim.Adam
    group = opt.param_groups[0]
    assert group["betas"] == (0.5, 0.6) and group["eps"] == 0.001 and group["amsgrad"] is True


def test_a_non_adam_class_gets_no_betas_and_overrides_win():
    optim = OptimConfig(lr=0.1, weight_decay=0.0, optimizer="SGD",
                        override_optimizer_config={"momentum": 0.9, "weight_decay": 0.5})
    settle_optim(optim, "critic.optim")
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2))], optim)
    assert type(opt) is torch.optim.SGD and opt.param_groups[0]["momentum"] == 0.9
    assert opt.param_groups[0]["weight_decay"] == 0.5  # the override replaces weight_decay, as in verl


def test_a_megatron_spelling_and_megatron_offload_options_are_mapped_with_a_line():
    notices: list[str] = []
    cfg = load_config("grpo", HF + [f"{A}.optimizer=adam",
                                    f"+{A}.override_optimizer_config.optimizer_offload_fraction=1",
                                    f"+{A}.override_optimizer_config.optimizer_cpu_offload=true"], notices=notices)
    optim = cfg.actor_rollout_ref.actor.optim
    assert optim.optimizer == "AdamW" and optim.override_optimizer_config == {}
    assert cfg.actor_rollout_ref.actor.fsdp_config.optimizer_offload is True
    said = "\n".join(notices)
    assert "optimizer=adam -> " in said and "optimizer_offload_fraction=1 -> nothing to set" in said


@pytest.mark.parametrize("override, words", [
    (f"{A}.optimizer=NoSuchOpt", "optim.optimizer=NoSuchOpt: no such class"),
    (f"{A}.optimizer_impl=no_such_pkg.optim", "cannot import"),
    (f"+{A}.override_optimizer_config.epsilon=1e-6", "takes no argument epsilon"),
])
def test_a_bad_optimizer_is_one_line_naming_the_key(override, words):
    with pytest.raises(UserError) as err:
        load_config("grpo", HF + [override])
    assert words in str(err.value)


def test_min_lr_floors_the_cosine_schedule():
    cfg = load_config("grpo", HF + [f"{A}.lr=1e-5", f"{A}.lr_scheduler_type=cosine", f"+{A}.min_lr=2e-6"])
    optim = cfg.actor_rollout_ref.actor.optim
    assert optim.min_lr_ratio == pytest.approx(0.2)
    param = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([param], optim)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(optim, total_steps=10))
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(1e-5) and min(lrs) == pytest.approx(2e-6) and lrs[-1] == pytest.approx(2e-6)


def test_min_lr_and_a_different_min_lr_ratio_are_one_error():
    with pytest.raises(UserError, match="two different floors"):
        load_config("grpo", HF + [f"{A}.lr=1e-5", f"+{A}.min_lr=2e-6", f"{A}.min_lr_ratio=0.5"])
    cfg = load_config("grpo", HF + [f"{A}.lr=1e-5", f"+{A}.min_lr=5e-6", f"{A}.min_lr_ratio=0.5"])
    assert cfg.actor_rollout_ref.actor.optim.min_lr_ratio == pytest.approx(0.5)


def test_the_sft_trainer_reads_the_same_optimizer_keys():
    from rlkit.config.sft_load import load_sft_config

    cfg = load_sft_config(["data.train_files=/x.parquet", "optim.optimizer=adam", "optim.lr=1e-5", "+optim.min_lr=1e-6",
                           "optim.lr_scheduler_type=cosine", "+optim.override_optimizer_config.eps=1e-6"])
    assert cfg.optim.optimizer == "AdamW" and cfg.optim.min_lr_ratio == pytest.approx(0.1)
    assert cfg.optim.override_optimizer_config == {"eps": 1e-6}
