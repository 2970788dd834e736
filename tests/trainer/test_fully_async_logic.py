"""Fully async training's pure pieces on handmade versions (no Ray): the staleness budget, the sample buffer
(oldest first, stale chunks dropped and counted) and partial-rollout chunks (tokens carry their versions)."""

from __future__ import annotations

import random

import pytest
import torch

from rlkit.protocol import Batch
from rlkit.trainer.step.fully_async import staleness_metrics
from rlkit.trainer.step.partial_rollout import PartialChunk
from rlkit.trainer.step.sample_buffer import Finished, SampleBuffer, StalenessBudget

STOP, PAD = 2, 0


def simulate(threshold: int, steps: int, batch: int, chunk: int, seed: int) -> tuple[list[int], int]:
    """A pump and a trainer on a clock: chunks finish in random order (as long responses do); returns the
    staleness of every trained sample and the number of dropped ones (replaced by new ones)."""
    rng = random.Random(seed)
    budget, buffer = StalenessBudget(batch, threshold, total=batch * steps), SampleBuffer(threshold)
    version, seq, running, lags, dropped = 0, 0, [], [], 0
    for step in range(1, steps + 1):
        trained = step - 1
        while True:
            while budget.may_start(chunk, version):  # the pump starts what the budget allows
                budget.start(chunk)
                buffer.begin(version, seq, chunk)
                running.append(Finished(version, seq, chunk))
                seq += 1
            rng.shuffle(running)
            if running:  # one chunk finishes, in random order
                buffer.add(running.pop())
            taken = buffer.take(batch, trained)
            budget.release(taken.dropped_samples)
            dropped += taken.dropped_samples
            if taken.items:
                break
        assert sum(item.size for item in taken.items) == batch
        lags += [trained - item.version for item in taken.items for _ in range(item.size)]
        version += 1  # the update, pushed to the engine
    return lags, dropped


@pytest.mark.parametrize("threshold", [0, 1, 3])
def test_trained_samples_are_never_older_than_the_threshold(threshold):
    for seed in range(5):
        lags, dropped = simulate(threshold, steps=12, batch=8, chunk=2, seed=seed)
        assert len(lags) == 12 * 8
        assert max(lags) <= threshold and min(lags) >= 0
        assert dropped == 0  # the buffer waited for due chunks instead of training younger ones in their place


def test_threshold_zero_is_on_policy_and_higher_runs_ahead():
    assert set(simulate(0, steps=6, batch=8, chunk=4, seed=0)[0]) == {0}
    lags, _ = simulate(2, steps=10, batch=8, chunk=4, seed=1)
    assert max(lags) == 2  # the pump ran ahead of the trainer (else the mode would be synchronous)


def test_an_older_chunk_still_generating_holds_the_batch_only_when_it_would_run_out_of_steps():
    def buffer_with_running_chunk() -> SampleBuffer:
        buffer = SampleBuffer(threshold=1)
        buffer.begin(version=0, seq=0, size=2)  # started under version 0: must train version 1 at the latest
        for version, seq in [(0, 1), (1, 2), (1, 3)]:
            buffer.add(Finished(version, seq, 2))
        return buffer

    early = buffer_with_running_chunk()
    assert [i.seq for i in early.take(4, trained_version=0).items] == [1, 2]  # chunk 0 still has step 2
    late = buffer_with_running_chunk()
    assert late.take(4, trained_version=1).items == []  # chunks 2/3 would take chunk 0's last chance: wait
    late.add(Finished(0, 0, 2))
    assert [i.seq for i in late.take(4, trained_version=1).items] == [0, 1]


def test_budget_admits_threshold_plus_one_batches_per_version_and_stops_at_the_total():
    budget = StalenessBudget(batch=8, threshold=1, total=20)
    assert budget.limit(0) == 16 and budget.limit(1) == 20  # capped by the run's total
    budget.start(16)
    assert not budget.may_start(2, version=0) and budget.may_start(2, version=1)
    budget.release(4)  # 4 dropped samples free their slots
    assert budget.may_start(4, version=0)


def test_buffer_takes_oldest_first_and_drops_and_counts_stale_chunks():
    buffer = SampleBuffer(threshold=1)
    for version, seq in [(3, 4), (1, 0), (2, 2), (2, 1), (3, 3)]:
        buffer.add(Finished(version, seq, 2, payload=f"v{version}s{seq}"))
    taken = buffer.take(4, trained_version=3)  # version 1 is 2 behind 3: dropped
    assert [i.payload for i in taken.dropped] == ["v1s0"] and taken.dropped_samples == 2
    assert [i.payload for i in taken.items] == ["v2s1", "v2s2"]  # oldest version, then start order
    assert len(buffer) == 4
    short = buffer.take(6, trained_version=3)  # only 4 ready: nothing taken, nothing lost
    assert short.items == [] and short.dropped == [] and len(buffer) == 4


def _segment(rows: list[list[int]], lps: list[list[float]], width: int) -> Batch:
    """An engine's output for `rows` (right-padded to the requested width)."""
    responses = torch.full((len(rows), width), PAD)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    log_probs = torch.zeros((len(rows), width))
    for i, (toks, lp) in enumerate(zip(rows, lps)):
        responses[i, : len(toks)] = torch.tensor(toks)
        mask[i, : len(toks)] = 1
        log_probs[i, : len(toks)] = torch.tensor(lp)
    return Batch({"responses": responses, "response_mask": mask, "rollout_log_probs": log_probs})


def test_partial_chunk_continues_from_the_tokens_so_far_and_records_each_tokens_version():
    ids = torch.tensor([[PAD, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    prompts = Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})
    prompts.non_tensors["uid"] = __import__("numpy").array(["a", "a"], dtype=object)
    chunk = PartialChunk(prompts, response_length=5, pad_id=PAD, stop_ids=[STOP])
    req, rows, max_tokens = chunk.request(segment=2)
    assert rows == [0, 1] and max_tokens == 2 and torch.equal(req["input_ids"], ids)
    chunk.add(rows, _segment([[11, 12], [13, STOP]], [[-0.1, -0.2], [-0.3, -0.4]], 2), version=4, max_tokens=2)
    assert chunk.done == [False, True]  # row 1 stopped on its stop token, at the segment's last position
    req, rows, max_tokens = chunk.request(segment=2)  # the weights changed in between: version 5
    assert rows == [0] and max_tokens == 2
    assert req["input_ids"].tolist() == [[PAD, 5, 6, 11, 12]] and req["attention_mask"].tolist() == [[0, 1, 1, 1, 1]]
    assert req["position_ids"].tolist() == [[0, 0, 1, 2, 3]]
    chunk.add(rows, _segment([[14, 15]], [[-0.5, -0.6]], 2), version=5, max_tokens=2)
    req, rows, max_tokens = chunk.request(segment=2)
    assert max_tokens == 1  # the response length caps the last segment
    chunk.add(rows, _segment([[16]], [[-0.7]], 1), version=6, max_tokens=1)
    assert chunk.finished
    out = chunk.assemble()
    assert out["responses"].tolist() == [[11, 12, 14, 15, 16], [13, STOP, PAD, PAD, PAD]]
    assert out["token_policy_version"].tolist() == [[4, 4, 5, 5, 6], [4, 4, -1, -1, -1]]
    assert out["policy_version"].tolist() == [4, 4]
    assert torch.allclose(out["rollout_log_probs"][0], torch.tensor([-0.1, -0.2, -0.5, -0.6, -0.7]))
    assert out["input_ids"][0].tolist() == [PAD, 5, 6, 11, 12, 14, 15, 16]
    assert out["uid"].tolist() == ["a", "a"]
    metrics = staleness_metrics(out, trained_version=6)
    assert metrics["rollout/staleness/max"] == 2 and metrics["rollout/mixed_version_samples"] == 0.5


def test_partial_chunk_without_segments_asks_for_the_whole_response():
    ids = torch.tensor([[5, 6]])
    mask = torch.ones_like(ids)
    chunk = PartialChunk(
        Batch({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1}),
        response_length=4,
        pad_id=PAD,
        stop_ids=[STOP],
    )
    _, rows, max_tokens = chunk.request(segment=0)
    assert max_tokens == 4
    chunk.add(rows, _segment([[9, STOP]], [[-1.0, -1.0]], 4), version=0, max_tokens=4)  # stopped early
    assert chunk.finished and chunk.assemble()["token_policy_version"].tolist() == [[0, 0, -1, -1]]


def test_pump_take_drops_stale_chunks_frees_their_budget_and_counts_them():
    from rlkit.trainer.step.rollout_pump import RolloutPump, VersionClock

    budget, buffer = StalenessBudget(batch=4, threshold=1, started=10), SampleBuffer(threshold=1)
    pump = RolloutPump(None, iter([]), None, VersionClock(value=3), budget, buffer, segment=0)
    buffer.add(Finished(0, 0, 2, payload="too old"))  # version 0 trained at version 3: lag 3 > 1
    buffer.add(Finished(2, 1, 2, payload="a"))
    buffer.add(Finished(3, 2, 2, payload="b"))
    chunks, dropped = pump.take(4, trained_version=3)
    assert chunks == ["a", "b"] and dropped == 2 and pump.dropped_total == 2
    assert budget.started == 8  # the dropped samples' slots went back to the pump


def test_pump_take_raises_the_pumps_error():
    from rlkit.trainer.step.rollout_pump import RolloutPump, VersionClock

    pump = RolloutPump(None, iter([]), None, VersionClock(), StalenessBudget(4, 1), SampleBuffer(1), segment=0)
    pump.error = ValueError("engine died")
    with pytest.raises(RuntimeError, match="rollout pump failed") as info:
        pump.take(4, trained_version=0)
    assert isinstance(info.value.__cause__, ValueError)
