"""A served teacher over real HTTP (rlkit/trainer/step/served_teacher.py) through the teacher phase
(rlkit/trainer/step/teacher_stage.py): a local server returns fixed prompt log-probs, or answers slowly, fails, or
sends malformed replies; a failed sample is masked out and counted, never the run's end."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

from rlkit.config.schema import RLConfig
from rlkit.protocol import Batch
from rlkit.testing import build_tiny_tokenizer
from rlkit.trainer.step.teacher_stage import TeacherStage
from tests.data.test_token_alignment import chunked_tokenizer

#: the behaviour of a request, chosen by its first prompt word (everything else: a normal reply)
MODES = {"reverse": "slow", "answer": "fail_once", "question": "always_500", "think": "malformed", "step": "short",
         "what": "echo"}


def fixed_log_prob(position: int) -> float:
    return -0.1 * position


class Handler(BaseHTTPRequestHandler):
    seen: set = set()
    requests: list = []

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ids = body["prompt"]
        Handler.requests.append(body)
        mode = self.server.modes.get(ids[0], "ok")
        key = tuple(ids)
        if mode == "slow":
            time.sleep(1.0)
        if mode == "always_500" or (mode == "fail_once" and key not in Handler.seen):
            Handler.seen.add(key)
            return self._send(500, b"busy")
        if mode == "malformed":
            return self._send(200, b"{not json")
        positions = [None] + [{str(t): {"logprob": fixed_log_prob(i), "rank": 1}} for i, t in enumerate(ids) if i]
        if mode == "short":
            positions = positions[:-1]
        choice = {"text": "x", "prompt_logprobs": positions}
        if mode == "echo":  # the plain OpenAI echo form
            choice = {"text": "x", "logprobs": {"token_logprobs": [None] + [fixed_log_prob(i) for i in
                                                                          range(1, len(ids))] + [-9.0]}}
        self._send(200, json.dumps({"choices": [choice]}).encode())

    def _send(self, status: int, data: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on a slow reply
            pass


@pytest.fixture(scope="module")
def server():
    tok = build_tiny_tokenizer()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.modes = {tok.convert_tokens_to_ids(word): mode for word, mode in MODES.items()}
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


def _cfg(url: str, **teacher) -> RLConfig:
    cfg = RLConfig()
    cfg.distillation.enabled = True
    cfg.distillation.teacher_models = {"big": {"model_path": "served-teacher", "base_url": url, "timeout_s": 0.3,
                                               "retries": 1, "retry_backoff_s": 0.01, **teacher}}
    return cfg


def _batch(tok, prompts: list[str], responses: list[str], width: int = 4) -> Batch:
    """Rows laid out as the rollout lays them out: left-padded prompts, right-padded responses (+ EOS)."""
    p_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    r_ids = [tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for r in responses]
    plen = max(map(len, p_ids))
    rows = len(prompts)
    ids = torch.full((rows, plen + width), tok.pad_token_id)
    att = torch.zeros((rows, plen + width), dtype=torch.long)
    for i, (p, r) in enumerate(zip(p_ids, r_ids)):
        ids[i, plen - len(p):plen], att[i, plen - len(p):plen] = torch.tensor(p), 1
        ids[i, plen:plen + len(r)], att[i, plen:plen + len(r)] = torch.tensor(r), 1
    return Batch({"prompts": ids[:, :plen], "responses": ids[:, plen:], "input_ids": ids, "attention_mask": att,
                  "response_mask": att[:, plen:]},
                 non_tensors={"data_source": np.array(["toy"] * rows, dtype=object)})


def test_failed_slow_and_malformed_replies_cost_their_sample_only(server):
    tok = build_tiny_tokenizer()
    stage = TeacherStage(_cfg(server), tok, None, {})
    words = ["copy", "reverse", "answer", "question", "think", "step", "what"]
    batch = _batch(tok, [f"{w} the digits : 7" for w in words], ["7 7", "1", "2", "3", "4", "5", "6 6"])
    start = time.perf_counter()
    out, metrics = stage(batch)
    elapsed = time.perf_counter() - start
    scored = out["teacher_mask"].sum(-1).tolist()
    plen = 5  # each prompt has 5 tokens: the response's token j sits at position 5 + j
    # copy: 2 digits + EOS scored with the fixed log-probs of positions 5, 6, 7
    assert out["teacher_log_probs"][0, :3].tolist() == pytest.approx([fixed_log_prob(plen + j) for j in range(3)])
    assert scored[0] == 3
    assert scored[1:5] == [0, 2, 0, 0]  # slow: timed out twice; fail_once: retried and scored; 500; malformed
    assert scored[5] == 0  # a reply with too few log-probs
    assert scored[6] == 3 and out["teacher_log_probs"][6, 2] == pytest.approx(fixed_log_prob(plen + 2))  # echo form
    assert metrics["distill/teacher_failed"] == 4 and metrics["distill/unscored_rows"] == 0
    assert elapsed < 3.0  # the slow rows ran concurrently with the rest, bounded by timeout_s x attempts
    assert (out["teacher_mask"] <= batch["response_mask"]).all()
    sent = Handler.requests[0]
    assert sent["model"] == "served-teacher" and sent["max_tokens"] == 1 and sent["echo"] is True


def test_rows_without_a_teacher_are_counted_not_scored(server):
    tok = build_tiny_tokenizer()
    cfg = _cfg(server, key="gsm8k")
    out, metrics = TeacherStage(cfg, tok, None, {})(_batch(tok, ["copy the digits : 7"], ["7"]))
    assert metrics["distill/unscored_rows"] == 1 and out["teacher_mask"].sum() == 0


def test_a_teacher_with_its_own_tokenizer_is_aligned_back(server, tmp_path):
    """Student: 2-character pieces; the served teacher's tokenizer: 3-character pieces (test_token_alignment)."""
    student, teacher = chunked_tokenizer(2), chunked_tokenizer(3)
    teacher.save_pretrained(tmp_path / "teacher_tok")
    stage = TeacherStage(_cfg(server, tokenizer_path=str(tmp_path / "teacher_tok")), student, None, {})
    assert stage.teachers[0].tokenizer is not None  # different vocabularies: re-tokenised
    out, metrics = stage(_batch(student, ["ab"], ["abcabcb a"], width=6))
    # teacher ids: prompt "ab" (1 token) + abc|abc|b a at positions 1, 2, 3
    lp = [fixed_log_prob(i) for i in (1, 2, 3)]
    want = [(lp[0] + lp[1]) / 3] * 3 + [lp[2] / 2] * 2 + [0.0]
    assert out["teacher_log_probs"][0].tolist() == pytest.approx(want)
    assert out["teacher_mask"][0].tolist() == [1, 1, 1, 1, 1, 0]  # EOS has no text: left out
    assert metrics["distill/teacher_failed"] == 0
