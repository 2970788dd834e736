"""The generative judge: template, parsers, config errors, and the http backend against a real local HTTP server
that answers /v1/chat/completions with fixed verdicts, slow replies, 500s and unparsable text.

The in-process vLLM judge is tested in test_llm_judge_vllm.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlkit.config.judge import JudgeConfig
from rlkit.errors import UserError
from rlkit.reward.judge_text import (
    DEFAULT_TEMPLATE,
    JUDGE_PARSERS,
    NO_GROUND_TRUTH,
    JudgeTemplate,
    last_number_0_10,
    load_parser,
    parse_score,
    prompt_text,
    yes_no,
)
from rlkit.reward.llm_judge import LLMJudge, check_judge_config, judge_metrics, judge_texts

# ---------------------------------------------------------------- a real OpenAI-style server
MARK = re.compile(r"MARK:(\w+)#(\d+)")


class JudgeServer:
    """/v1/chat/completions; what it does depends on `MARK:<behaviour>#<id>` in the judge prompt:
    good -> "Score: <id % 11>", slow -> sleeps `slow_s` then answers, e500 -> always 500,
    flaky -> 500 on the first request for that id then "Score: 6", garbage -> no number,
    e404 -> 404, badjson -> 200 with a non-JSON body, hold -> sleeps `hold_s` then "Score: 5"."""

    def __init__(self, slow_s: float = 2.0, hold_s: float = 0.15) -> None:
        self.slow_s, self.hold_s = slow_s, hold_s
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.auth: list[str | None] = []
        self.per_id: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    server.auth.append(self.headers.get("Authorization"))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, text = server.answer(self.path, body)
                finally:
                    with server.lock:
                        server.in_flight -= 1
                try:
                    payload = text.encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def answer(self, path: str, body: dict) -> tuple[int, str]:
        if path != "/v1/chat/completions":
            return 404, json.dumps({"error": f"no route {path}"})
        content = body["messages"][-1]["content"]
        m = MARK.search(content)
        kind, ident = (m.group(1), m.group(2)) if m else ("good", "0")
        with self.lock:
            self.per_id[f"{kind}#{ident}"] += 1
            seen = self.per_id[f"{kind}#{ident}"]
        if kind == "slow":
            time.sleep(self.slow_s)
            return 200, reply("Score: 9")
        if kind == "hold":
            time.sleep(self.hold_s)
            return 200, reply("Score: 5")
        if kind == "e500":
            return 500, json.dumps({"error": "internal"})
        if kind == "flaky":
            return (500, json.dumps({"error": "warming up"})) if seen == 1 else (200, reply("Score: 6"))
        if kind == "garbage":
            return 200, reply("I cannot decide on this one.")
        if kind == "e404":
            return 404, json.dumps({"error": "model not found"})
        if kind == "badjson":
            return 200, "<html>proxy error</html>"
        return 200, reply(f"Reasonable answer. Score: {int(ident) % 11}")

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def reply(text: str) -> str:
    return json.dumps({"id": "x", "object": "chat.completion", "model": "judge",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "finish_reason": "stop"}]})  # fmt: skip


@pytest.fixture
def server():
    srv = JudgeServer()
    yield srv
    srv.close()


def http_cfg(server: JudgeServer, **kw) -> JudgeConfig:
    base = dict(backend="http", base_url=server.url, model="judge-model", timeout_s=5.0, retries=2,
                retry_backoff_s=0.01, concurrency=4)  # fmt: skip
    return JudgeConfig(**{**base, **kw})


def score_marks(judge: LLMJudge, marks: list[str]):
    return judge.score([f"question {i}" for i in range(len(marks))], [f"MARK:{m}" for m in marks], ["42"] * len(marks))


# ---------------------------------------------------------------- http backend
def test_http_fixed_verdicts_and_request_shape(server, monkeypatch):
    monkeypatch.setenv("RLKIT_TEST_JUDGE_KEY", "sekret")
    cfg = http_cfg(server, api_key_env="RLKIT_TEST_JUDGE_KEY", max_tokens=17, temperature=0.3)
    with LLMJudge(cfg) as judge:
        verdicts = score_marks(judge, ["good#10", "good#3", "good#0"])
    assert [v.score for v in verdicts] == [1.0, 0.3, 0.0]
    assert all(v.error is None and v.attempts == 1 for v in verdicts)
    assert verdicts[1].raw == "Reasonable answer. Score: 3"
    assert len(server.requests) == 3
    assert set(server.auth) == {"Bearer sekret"}
    body = next(b for b in server.requests if "good#3" in b["messages"][0]["content"])
    assert body["model"] == "judge-model" and body["max_tokens"] == 17 and body["temperature"] == 0.3
    expected = JudgeTemplate(DEFAULT_TEMPLATE).render("question 1", "MARK:good#3", "42")
    assert body["messages"] == [{"role": "user", "content": expected}]


def test_http_failures_cost_zero_and_are_counted(server):
    cfg = http_cfg(server, timeout_s=0.3, retries=2)
    marks = ["good#8", "slow#1", "e500#2", "flaky#3", "garbage#4", "e404#5", "badjson#6"]
    start = time.monotonic()
    with LLMJudge(cfg) as judge:
        verdicts = score_marks(judge, marks)
    elapsed = time.monotonic() - start
    by = dict(zip(marks, verdicts))
    assert by["good#8"].score == pytest.approx(0.8) and by["good#8"].error is None
    # slow: every attempt times out (3 x 0.3 s, well under the server's 2 s), then 0 + "timeout"
    assert (by["slow#1"].score, by["slow#1"].error, by["slow#1"].attempts) == (0.0, "timeout", 3)
    assert elapsed < 1.9, "the timeout bounds each attempt; the slow server must not be waited for"
    # 500: retried, then 0 + "http 500"
    assert (by["e500#2"].score, by["e500#2"].error, by["e500#2"].attempts) == (0.0, "http 500", 3)
    assert server.per_id["e500#2"] == 3
    # flaky: the retry succeeds
    assert (by["flaky#3"].score, by["flaky#3"].error, by["flaky#3"].attempts) == (0.6, None, 2)
    assert server.per_id["flaky#3"] == 2
    # unparsable text: 0 + counted error, no retry
    assert by["garbage#4"].score == 0.0 and by["garbage#4"].error.startswith("unparsable: ")
    assert by["garbage#4"].raw == "I cannot decide on this one." and server.per_id["garbage#4"] == 1
    # a 4xx is not retried
    assert by["e404#5"].error.startswith("http 404: ") and "model not found" in by["e404#5"].error
    assert server.per_id["e404#5"] == 1
    assert by["badjson#6"].error.startswith("bad reply: ") and by["badjson#6"].score == 0.0

    metrics = judge_metrics(verdicts)
    assert metrics["reward/judge/mean"] == pytest.approx((0.8 + 0.6) / 7)
    assert metrics["reward/judge/errors"] == 5
    assert metrics["reward/judge/retries"] == 2 + 2 + 1
    assert metrics["reward/judge/errors/timeout"] == 1
    assert metrics["reward/judge/errors/http_500"] == 1
    assert metrics["reward/judge/errors/http_404"] == 1
    assert metrics["reward/judge/errors/unparsable"] == 1
    assert metrics["reward/judge/errors/bad_reply"] == 1


def test_http_concurrency_is_bounded(server):
    cfg = http_cfg(server, concurrency=3)
    n = 12
    start = time.monotonic()
    with LLMJudge(cfg) as judge:
        verdicts = score_marks(judge, [f"hold#{i}" for i in range(n)])
    elapsed = time.monotonic() - start
    assert [v.score for v in verdicts] == [0.5] * n
    assert server.max_in_flight == 3, "never more than `concurrency` requests in flight, and that many used"
    assert elapsed >= (n / 3) * server.hold_s * 0.9


def test_http_connection_refused_is_an_error_after_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the judge connects: nothing listens there
    cfg = JudgeConfig(backend="http", base_url=f"http://127.0.0.1:{port}/v1", model="m", retries=1,
                      retry_backoff_s=0.0, timeout_s=2.0)  # fmt: skip
    verdicts, metrics = judge_texts(cfg, ["p"], ["r"])
    assert verdicts[0].score == 0.0 and verdicts[0].error.startswith("connection: ")
    assert verdicts[0].attempts == 2
    assert metrics["reward/judge/errors"] == 1 and metrics["reward/judge/errors/connection"] == 1


def test_http_score_inside_a_running_event_loop(server):
    """An async driver may call the (sync) judge from a coroutine; the judge runs its own loop aside."""

    async def main():
        with LLMJudge(http_cfg(server)) as judge:
            return score_marks(judge, ["good#7", "good#2"])

    assert [v.score for v in asyncio.run(main())] == [0.7, 0.2]


def test_http_user_template_and_parser(server, tmp_path):
    parser_file = tmp_path / "my_parser.py"
    parser_file.write_text("def halve(text):\n    return float(text.rsplit(':', 1)[1]) / 20\n")
    cfg = http_cfg(server, template="Q={prompt} A={response} REF={ground_truth} {{json}}",
                   parser=f"{parser_file}:halve")  # fmt: skip
    with LLMJudge(cfg) as judge:
        verdicts = judge.score(["what"], ["MARK:good#4"], [None])
    assert verdicts[0].score == pytest.approx(0.2)
    assert server.requests[0]["messages"][0]["content"] == f"Q=what A=MARK:good#4 REF={NO_GROUND_TRUTH} {{json}}"


def test_judge_texts_without_requests():
    cfg = JudgeConfig(backend="http", base_url="http://127.0.0.1:9/v1", model="m")
    assert judge_texts(cfg, [], [])[0] == []


# ---------------------------------------------------------------- template
def test_template_fills_placeholders_and_keeps_other_braces():
    t = JudgeTemplate('P:{prompt}|R:{response}|G:{ground_truth}|{{literal}}|{"score": 7}|{ not a field }')
    assert t.render("p {x}", "r", "g") == 'P:p {x}|R:r|G:g|{literal}|{"score": 7}|{ not a field }'
    assert t.render("p", "r", None) == f'P:p|R:r|G:{NO_GROUND_TRUTH}|{{literal}}|{{"score": 7}}|{{ not a field }}'


def test_default_template_renders_every_field():
    text = JudgeTemplate(DEFAULT_TEMPLATE).render("PROMPT_X", "RESPONSE_Y", "TRUTH_Z")
    assert "PROMPT_X" in text and "RESPONSE_Y" in text and "TRUTH_Z" in text
    assert "{" not in text and "0" in text and "10" in text


def test_template_errors():
    with pytest.raises(UserError, match=r"reward_model\.judge\.template: unknown placeholder \{respones\}"):
        JudgeTemplate("{prompt} {respones}")
    with pytest.raises(UserError, match=r"has no \{response\}"):
        JudgeTemplate("{prompt} only")


def test_template_from_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("Grade {response} for {prompt}")
    assert JudgeTemplate.from_config("", str(path)).render("p", "r", None) == "Grade r for p"
    with pytest.raises(UserError, match=r"reward_model\.judge\.template_path: cannot read .*missing\.txt"):
        JudgeTemplate.from_config("", str(tmp_path / "missing.txt"))
    path.write_text("Grade {reponse}")
    with pytest.raises(UserError, match=r"template_path \(.*t\.txt\): unknown placeholder \{reponse\}"):
        JudgeTemplate.from_config("", str(path))
    assert JudgeTemplate.from_config("", None).text == DEFAULT_TEMPLATE


def test_prompt_text_from_chat_messages():
    assert prompt_text("plain") == "plain"
    assert prompt_text([{"role": "user", "content": "hi"}]) == "hi"
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert prompt_text(chat) == "system: be brief\nuser: hi"


# ---------------------------------------------------------------- parsers
@pytest.mark.parametrize(
    "text, expected",
    [
        ("Score: 7", 0.7),
        ("Score: 8/10", 0.8),
        ("7 out of 10", 0.7),
        ("Score: 10/10", 1.0),
        ("It mentions 2024 and 3 apples; I give 9.", 0.9),
        ("score 7.5", 0.75),
        ("first 4, then -3", 0.4),
        ("Score: 0", 0.0),
        ("no digits at all", None),
        ("Score: 11", None),
        ("", None),
    ],
)
def test_last_number_0_10(text, expected):
    got = last_number_0_10(text)
    assert got == (pytest.approx(expected) if expected is not None else None)


def test_yes_no():
    assert yes_no("Is it correct? Yes.") == 1.0
    assert yes_no("yes at first, but no") == 0.0
    assert yes_no("Nothing, yesterday") is None


def test_parser_registry_and_user_parser(tmp_path):
    assert load_parser("last_number_0_10") is last_number_0_10
    with pytest.raises(UserError, match=r"reward_model\.judge\.parser.*Did you mean 'last_number_0_10'"):
        load_parser("last_numbr_0_10")
    path = tmp_path / "p.py"
    path.write_text("def first_char(text):\n    return 1.0 if text.startswith('A') else 0.0\n")
    fn = load_parser(f"{path}:first_char")
    assert fn("Alpha") == 1.0 and fn("beta") == 0.0
    with pytest.raises(UserError, match=r"^reward_model\.judge\.parser: 'nope' not found in .*first_char"):
        load_parser(f"{path}:nope")
    with pytest.raises(UserError, match=r"^reward_model\.judge\.parser: file not found"):
        load_parser(f"{tmp_path}/absent.py:f")
    assert "last_number_0_10" in JUDGE_PARSERS.builtin_names()


def test_parse_score_never_raises():
    def boom(text):
        raise RuntimeError("bad parser")

    def refuse(text):
        raise ValueError("no verdict line")

    assert parse_score(last_number_0_10, "Score: 3") == (pytest.approx(0.3), None)
    assert parse_score(last_number_0_10, "meh") == (0.0, "unparsable: 'meh'")
    assert parse_score(refuse, "x") == (0.0, "unparsable: no verdict line")
    assert parse_score(boom, "x") == (0.0, "parser error: RuntimeError: bad parser")
    assert parse_score(lambda t: float("nan"), "x") == (0.0, "parser error: returned nan")
    assert parse_score(lambda t: "high", "x") == (0.0, "parser error: returned str, not a number")


# ---------------------------------------------------------------- config errors
@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(backend="htp", base_url="http://x/v1", model="m"), r"reward_model\.judge\.backend.*'htp'.*'http'"),
        (dict(backend="http", model="m"), r"reward_model\.judge\.base_url is empty"),
        (dict(backend="http", base_url="127.0.0.1:8000/v1", model="m"), r"base_url=.* must start with http"),
        (dict(backend="http", base_url="http://x/v1"), r"reward_model\.judge\.model is empty"),
        (dict(backend="vllm"), r"reward_model\.judge\.model is empty; the vllm judge needs a local model folder"),
        (dict(backend="http", base_url="http://x/v1", model="m", template="{prompt}"), r"has no \{response\}"),
        (dict(backend="http", base_url="http://x/v1", model="m", parser="nope"), r"unknown judge parser"),
    ],
)
def test_config_errors_name_the_key(kw, message):
    cfg = JudgeConfig(**kw)
    with pytest.raises(UserError, match=message):
        check_judge_config(cfg)
    with pytest.raises(UserError, match=message):
        LLMJudge(cfg)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(concurrency=0), r"reward_model\.judge\.concurrency=0 must be >= 1"),
        (dict(timeout_s=0), r"reward_model\.judge\.timeout_s=0 must be > 0"),
        (dict(retries=-1), r"reward_model\.judge\.retries=-1 must be >= 0"),
        (dict(temperature=-0.1), r"temperature=-0.1 must be >= 0"),
        (dict(dtype="fp8"), r"reward_model\.judge\.dtype='fp8'"),
        (dict(max_model_len=64, max_tokens=64), r"max_model_len=64 leaves no room"),
        (dict(template="{response}", template_path="t.txt"), r"template and .*template_path are both set"),
    ],
)
def test_config_values_are_validated(kw, message):
    with pytest.raises(UserError, match=message):
        JudgeConfig(**kw)


def test_score_checks_lengths(server):
    with LLMJudge(http_cfg(server)) as judge, pytest.raises(ValueError, match="1 prompts, 2 responses"):
        judge.score(["p"], ["a", "b"], [None])


class BrokenBackend:
    """A backend with a bug: the judge must still answer every sample (0 + error), never raise."""

    def __init__(self, replies: list | None = None) -> None:
        self.replies = replies

    def complete(self, prompts):
        if self.replies is None:
            raise RuntimeError("engine died")
        return self.replies

    def close(self) -> None:
        pass


def test_a_failing_backend_costs_zero_never_raises():
    cfg = JudgeConfig(backend="http", base_url="http://127.0.0.1:9/v1", model="m")
    verdicts = LLMJudge(cfg, backend=BrokenBackend()).score(["a", "b"], ["r", "s"], [None, None])
    assert [(v.score, v.error) for v in verdicts] == [(0.0, "backend: RuntimeError: engine died")] * 2
    verdicts = LLMJudge(cfg, backend=BrokenBackend(replies=[])).score(["a"], ["r"], [None])
    assert verdicts[0].score == 0.0 and verdicts[0].error == "backend: 0 replies for 1 prompts"
