"""The SGLang stand-in's latency model (`guirl.testing.fakes.sglang_timing`) on a fake clock: the simulated
GPU's time advances only through the backend's own sleeps, so every time below is the model's arithmetic
(prefill forwards, decode steps that slow with the batch), never the machine's speed. Expected times are
sums of the model's `prefill_time`/`step_time`, in the order the module docstring says SGLang runs them."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from types import SimpleNamespace

import msgspec
import pytest

from guirl.testing.fakes.sglang_timing import TimingBackend, TimingModel

MODEL = TimingModel(
    prefill_s_per_token=0.001,
    prefill_s_per_batch=0.01,
    max_prefill_tokens=1000,
    decode_s_base=0.02,
    decode_s_per_seq=0.005,
    max_running=8,
)
EOS = 2


class FakeClock:
    """Time that moves only when the backend sleeps; `until(t)` wakes a test coroutine once it has."""

    def __init__(self) -> None:
        self.t = 100.0
        self._alarms: list[tuple[float, asyncio.Future]] = []

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        for at, fut in [a for a in self._alarms if a[0] <= self.t]:
            self._alarms.remove((at, fut))
            fut.set_result(None)
        await asyncio.sleep(0)

    async def until(self, t: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._alarms.append((t, fut))
        await fut


def sampling(max_new_tokens: int, *, ignore_eos: bool = True) -> SimpleNamespace:
    """SGLang's normalized sampling params, as far as the backend reads them."""
    return SimpleNamespace(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos, temperature=1.0, top_k=-1)


def backend(clock: FakeClock, model: TimingModel = MODEL) -> TimingBackend:
    return TimingBackend(
        model,
        list(range(10, 100)),
        EOS,
        pad_id=5,
        decode=lambda ids: " ".join(map(str, ids)),
        clock=clock,
        sleep=clock.sleep,
    )


def simulate(coro_fn, model: TimingModel = MODEL):
    """Run `coro_fn(backend, clock)` against a started backend on a fake clock."""

    async def main():
        clock = FakeClock()
        b = backend(clock, model)
        await b.start()
        try:
            return await asyncio.wait_for(coro_fn(b, clock), 10)
        finally:
            await b.close()

    return asyncio.run(main())


def test_a_short_request_joins_the_running_batch_and_finishes_first() -> None:
    prompt = [11] * 200

    async def scenario(b: TimingBackend, clock: FakeClock):
        long = asyncio.ensure_future(b.generate(prompt, None, sampling(100), False, 1))
        await clock.until(clock.t + 0.5)  # the long one is decoding by now
        assert b.running and not b.waiting
        short = await b.generate(prompt, None, sampling(5), False, 2)
        return await long, short

    long, short = simulate(scenario)
    m = MODEL
    assert long.first_token_at == pytest.approx(long.queued_at + m.prefill_time(200))
    assert long.first_token_at < short.queued_at < short.first_token_at < short.finished_at < long.finished_at
    # the short one waited for the step under way to end, then for its own prefill (the long one paused)
    step_end = short.first_token_at - m.prefill_time(200)
    assert short.queued_at <= step_end < short.queued_at + m.step_time(1) + 1e-9
    # it then decoded its other 4 tokens beside the long one, in steps of two sequences
    assert short.finished_at - short.first_token_at == pytest.approx(4 * m.step_time(2))
    # the long one: its 99 steps, 4 of them shared, plus the short one's prefill
    alone = m.prefill_time(200) + 99 * m.step_time(1)
    shared = m.prefill_time(200) + 4 * (m.step_time(2) - m.step_time(1))
    assert long.finished_at - long.queued_at == pytest.approx(alone + shared)
    assert len(long.response_ids) == 100 and len(short.response_ids) == 5


def test_decode_steps_slow_with_the_batch_and_prefills_share_a_forward() -> None:
    one = simulate(lambda b, c: b.generate([11] * 100, None, sampling(20), False, 0))
    eight = simulate(
        lambda b, c: asyncio.gather(*(b.generate([11] * 100, None, sampling(20), False, i) for i in range(8)))
    )
    m = MODEL
    assert one.first_token_at - one.queued_at == pytest.approx(m.prefill_time(100))
    assert one.finished_at - one.first_token_at == pytest.approx(19 * m.step_time(1))
    for r in eight:  # 800 prompt tokens fit one forward; 8 sequences per step, each step slower
        assert r.first_token_at - r.queued_at == pytest.approx(m.prefill_time(800))
        assert r.finished_at - r.first_token_at == pytest.approx(19 * m.step_time(8))
    assert eight[0].finished_at - eight[0].queued_at > one.finished_at - one.queued_at


def test_prefill_budget_and_running_cap() -> None:
    model = msgspec.structs.replace(MODEL, max_running=2)

    async def scenario(b: TimingBackend, clock: FakeClock):
        out = await asyncio.gather(*(b.generate([11] * 600, None, sampling(10), False, i) for i in range(3)))
        return out, b.stats()

    (a, c, d), stats = simulate(scenario, model)
    # 600 + 600 tokens exceed one forward's 1000: one prefill each; the third waits for a running slot
    assert stats["prefills"] == 3 and stats["requests"] == 3 and stats["tokens"] == 30
    assert a.first_token_at < c.first_token_at < a.finished_at <= d.first_token_at
    assert d.first_token_at == pytest.approx(a.finished_at + model.prefill_time(600))


def test_an_aborted_request_leaves_the_batch() -> None:
    async def scenario(b: TimingBackend, clock: FakeClock):
        doomed = asyncio.ensure_future(b.generate([11] * 10, None, sampling(1000), False, 1))
        kept = asyncio.ensure_future(b.generate([11] * 10, None, sampling(50), False, 2))
        await clock.until(clock.t + 0.3)
        doomed.cancel()
        result = await kept
        assert doomed.cancelled()
        return result, b

    result, b = simulate(scenario)
    assert len(result.response_ids) == 50 and not b.running and not b.waiting
    # after the abort its steps carried one sequence, not two
    assert result.finished_at - result.first_token_at < 49 * MODEL.step_time(2) - MODEL.step_time(1)


def test_responses_are_deterministic_per_seed_and_respect_the_budget() -> None:
    model = msgspec.structs.replace(MODEL, length_median=30, length_sigma=1.0)

    async def scenario(b: TimingBackend, clock: FakeClock):
        free = [
            await b.generate([11] * 10, None, sampling(10_000, ignore_eos=False), True, s) for s in range(40)
        ]
        again = await b.generate([11] * 10, None, sampling(10_000, ignore_eos=False), True, 7)
        cut = [await b.generate([11] * 10, None, sampling(8, ignore_eos=False), False, s) for s in range(40)]
        by_prompt = [await b.generate([11, 12, 13], None, sampling(10_000, ignore_eos=False), False, None)]
        by_prompt.append(
            await b.generate([11, 12, 13], None, sampling(10_000, ignore_eos=False), False, None)
        )
        return free, again, cut, by_prompt

    free, again, cut, by_prompt = simulate(scenario, model)
    assert (again.response_ids, again.logprobs) == (free[7].response_ids, free[7].logprobs)
    assert by_prompt[0].response_ids == by_prompt[1].response_ids  # no seed: keyed by the prompt ids
    assert len({len(r.response_ids) for r in free}) > 10  # lengths differ from request to request
    for r in free:
        assert r.finish_reason == "stop" and r.response_ids[-1] == EOS and r.matched == EOS
        assert all(10 <= t < 100 for t in r.response_ids[:-1])
        assert len(r.logprobs) == len(r.response_ids) and all(math.isfinite(v) and v <= 0 for v in r.logprobs)
        assert r.text == " ".join(map(str, r.response_ids))
    for seed, r in enumerate(cut):  # same draws as `free`, cut by an 8-token budget
        n = len(free[seed].response_ids)
        assert r.logprobs is None
        if n <= 8:
            assert (r.finish_reason, r.response_ids) == ("stop", free[seed].response_ids)
        else:
            assert r.finish_reason == "length" and len(r.response_ids) == 8 and EOS not in r.response_ids


def test_length_distribution_is_long_tailed_and_capped() -> None:
    model = TimingModel(length_median=60, length_sigma=1.0, max_length=512)
    draws = [model.length(random.Random(f"0:{i}")) for i in range(4000)]
    assert 1 <= min(draws) and max(draws) == 512  # ~1.6 % of draws lie beyond the cap
    assert 54 <= statistics.median(draws) <= 66
    p95 = sorted(draws)[int(0.95 * len(draws))]
    assert p95 > 4 * statistics.median(draws)  # lognormal(sigma 1): the 95th percentile is ~5x the median
    assert statistics.mean(draws) > 1.4 * statistics.median(draws)


def test_settings_come_from_json_and_bad_ones_are_refused() -> None:
    text = '{"decode_s_base": 0.03, "length_median": 80}'
    model = msgspec.json.decode(text, type=TimingModel)
    assert model.step_time(10) == pytest.approx(0.03 + 10 * model.decode_s_per_seq)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode('{"decode_s_base": 0.03, "decode_ms": 1}', type=TimingModel)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode('{"max_running": 0}', type=TimingModel)


class FakeTokenizer:
    """What `TimingBackend.from_json` reads of a Hugging Face tokenizer."""

    all_special_ids = [0, 1, 2, 5]
    eos_token_id = 2
    unk_token_id = None

    def __len__(self) -> int:
        return 8

    def convert_tokens_to_ids(self, token: str) -> int:
        return 5 if token == "<|image_pad|>" else 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(96 + i) for i in ids)


def test_from_json_builds_responses_of_ordinary_tokens() -> None:
    b = TimingBackend.from_json('{"length_median": 3}', FakeTokenizer())
    assert b.model.length_median == 3 and b.vocab == [3, 4, 6, 7] and b.eos_id == 2
    assert b.image_tokens([5, 5, 3, 5]) == 3 and b.decode([3, 4]) == "cd"
