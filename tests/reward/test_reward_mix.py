"""The reward mix: rule scores and RM scores weighted as configured, per data_source; per-component metrics;
the config errors of the model reward. The RM is a real tiny one, called through the real worker role in
this process (the trainer calls the same method through its group)."""

from __future__ import annotations

import pytest
import torch

from rlkit.errors import UserError
from rlkit.reward.mix import build_reward_fn
from rlkit.testing import build_tiny_tokenizer
from rlkit.trainer.run.run_config import load_config
from rlkit.workers.reward_model import RewardModelWorker
from tests.reward.rm_helpers import policy_batch, save_rm

PROMPTS = ["copy the digits : 7", "copy the digits : 1 2", "copy the digits : 3", "copy the digits : 4 5"]
RESPONSES = ["7", "1 2", "8", "4 4"]  # toy_copy accuracy: 1, 1, 0, 0.5
RULE = torch.tensor([1.0, 1.0, 0.0, 0.5])


def config(tmp_path, rm_path, *extra: str):
    return load_config(
        "grpo",
        [
            f"data.train_files={tmp_path / 'x.parquet'}",
            "reward_model.enable=true",
            f"reward_model.model.path={rm_path}",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return save_rm(tmp_path_factory.mktemp("rm") / "rm")


@pytest.fixture(scope="module")
def rm_worker(rm_path, process_group):
    cfg = load_config(
        "grpo", ["data.train_files=x.parquet", "reward_model.enable=true", f"reward_model.model.path={rm_path}"]
    )
    worker = RewardModelWorker(cfg.reward_model)
    worker.init_model()
    return worker


def mixed(cfg, worker, batch):
    fn = build_reward_fn(cfg, build_tiny_tokenizer(), {"reward_model": worker})
    return fn(batch)


def test_weights_are_applied_and_each_component_is_logged(tmp_path, rm_path, rm_worker):
    batch = policy_batch(PROMPTS, RESPONSES)
    rm = rm_worker.compute_rm_score(batch)["rm_scores"].sum(-1)
    out = mixed(config(tmp_path, rm_path, "+reward_model.mix={rule: 2.0, rm: 0.5}"), rm_worker, batch)
    scores = out["token_level_scores"]
    assert torch.allclose(scores.sum(-1), 2.0 * RULE + 0.5 * rm, atol=1e-6)
    assert torch.equal(scores.nonzero()[:, 1], batch["response_mask"].sum(-1) - 1)  # on the last valid token
    metrics = out.meta["metrics"]
    assert metrics["reward/rule/mean"] == [pytest.approx(float(RULE.mean()))]
    assert metrics["reward/rm/mean"] == [pytest.approx(float(rm.mean()))]
    assert "reward/errors" in metrics  # the rule manager's own metrics stay
    assert torch.allclose(out["rm_scores"].sum(-1), rm)
    # no mix named: each running component weighs 1
    plain = mixed(config(tmp_path, rm_path), rm_worker, batch)
    assert torch.allclose(plain["token_level_scores"].sum(-1), RULE + rm, atol=1e-6)


def test_by_data_source_and_rows_without_a_scorer(tmp_path, rm_path, rm_worker):
    batch = policy_batch(PROMPTS, RESPONSES)
    batch["data_source"] = ["rlkit/toy_copy", "chat", "rlkit/toy_copy", "chat"]  # "chat" has no rule scorer
    rm = rm_worker.compute_rm_score(batch)["rm_scores"].sum(-1)
    cfg = config(tmp_path, rm_path, "+reward_model.mix={rule: 1.0, rm: 0.0, by_data_source: {chat: {rm: 3.0}}}")
    out = mixed(cfg, rm_worker, batch)
    want = torch.tensor([RULE[0], 3.0 * rm[1], RULE[2], 3.0 * rm[3]])
    assert torch.allclose(out["token_level_scores"].sum(-1), want, atol=1e-6)
    assert out.meta["metrics"]["reward/rule/mean"] == [pytest.approx(float((RULE[0] + RULE[2]) / 2))]
    # pure RM: rule 0 runs no scorer at all (no rule metrics)
    pure = mixed(config(tmp_path, rm_path, "+reward_model.mix={rule: 0, rm: 1}"), rm_worker, batch)
    assert torch.allclose(pure["token_level_scores"].sum(-1), rm, atol=1e-6)
    assert "reward/rule/mean" not in pure.meta["metrics"] and "reward/errors" not in pure.meta["metrics"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["reward_model.enable=true"], "needs reward_model.model.path"),
        (
            ["reward_model.enable=true", "reward_model.model.path=RM", "+reward_model.mix={rule: 1, rn: 1}"],
            "reward_model.mix.rn: unknown reward component; components: rule, judge, rm",
        ),
        (
            ["reward_model.enable=true", "reward_model.model.path=RM", "+reward_model.mix={rule: 1, judge: 1}"],
            "reward_model.mix.judge is set but the judge component does not run with reward_model.style=classifier",
        ),
        (
            ["reward_model.enable=true", "reward_model.model.path=RM", "+reward_model.mix={rule: 0, rm: 0}"],
            "every weight is 0",
        ),
        (
            ["reward_model.enable=true", "reward_model.model.path=RM", "+reward_model.mix={rm: high}"],
            "reward_model.mix.rm='high' must be a number",
        ),
        (
            [
                "reward_model.enable=true",
                "reward_model.model.path=RM",
                "+reward_model.mix={by_data_source: {gsm8k: {rms: 1}}}",
            ],
            "reward_model.mix.by_data_source.gsm8k.rms: unknown reward component",
        ),
        (["+reward_model.mix={rule: 2}"], "reward_model.mix is set but reward_model.enable=false"),
        (
            ["reward_model.enable=true", "reward_model.style=classifer", "reward_model.model.path=RM"],
            "reward_model.style='classifer' is not registered",
        ),
        (
            ["reward_model.enable=true", "reward_model.model.path=RM", "reward_model.micro_batch_size_per_gpu=0"],
            "reward_model.micro_batch_size_per_gpu",
        ),
    ],
)
def test_config_errors(overrides, message):
    with pytest.raises(UserError) as err:
        load_config("grpo", ["data.train_files=x.parquet", *overrides])
    assert message in str(err.value), str(err.value)


class VerdictServer:
    """A real local OpenAI-style endpoint: "Score: 10" when the judged response is "7", 500 when it is "8"
    (every retry), else "Score: 0"."""

    def __init__(self) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                response = body["messages"][-1]["content"].split("RESPONSE:", 1)[1].strip()
                status, text = (500, "") if response == "8" else (200, f"Score: {10 if response == '7' else 0}")
                payload = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload.encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_judge_style_mixes_with_rule_scores(tmp_path):
    server = VerdictServer()
    try:
        cfg = load_config(
            "grpo",
            [
                "data.train_files=x.parquet",
                "reward_model.enable=true",
                "reward_model.style=judge",
                f"reward_model.judge.base_url={server.url}",
                "reward_model.judge.model=judge",
                "reward_model.judge.retries=1",
                "reward_model.judge.retry_backoff_s=0.01",
                "reward_model.judge.template='PROMPT: {prompt} RESPONSE: {response}'",
                "+reward_model.mix={rule: 1.0, judge: 2.0}",
            ],
        )
        fn = build_reward_fn(cfg, build_tiny_tokenizer())
        out = fn(policy_batch(PROMPTS, ["7", "1 2", "8", "4 4"]))
        fn.close()
    finally:
        server.close()
    judge = torch.tensor([1.0, 0.0, 0.0, 0.0])  # "Score: 10" -> 1.0; the 500 scores 0 with an error
    assert torch.allclose(out["token_level_scores"].sum(-1), RULE + 2.0 * judge, atol=1e-6)
    metrics = out.meta["metrics"]
    assert metrics["reward/judge/mean"] == [pytest.approx(0.25)]
    assert metrics["reward/judge/errors"] == [1.0]
    assert metrics["reward/rule/mean"] == [pytest.approx(float(RULE.mean()))]


def test_interaction_reward_weight_wraps_the_reward_stage_only_for_agent_runs():
    from rlkit.reward.interaction_reward import WithInteractionReward

    tok = build_tiny_tokenizer()
    base = ["data.train_files=x.parquet", "actor_rollout_ref.rollout.multi_turn.interaction_reward_weight=0.5"]
    plain = build_reward_fn(load_config("grpo", base), tok)
    assert not isinstance(plain, WithInteractionReward)  # no agent loop: no interaction reward to add
    agent = build_reward_fn(load_config("grpo", [*base, "actor_rollout_ref.rollout.multi_turn.enable=true"]), tok)
    assert isinstance(agent, WithInteractionReward) and agent.weight == 0.5
