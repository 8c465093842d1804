"""The learner's weight delivery (`guirl.learner.publish.WeightDelivery`): a broadcast when engines are up
and it works, else the disk path for that version, with the broken group closed so the next version sets
up a fresh one. The publishers are stand-ins recording what they were asked: the real ones have tests of
their own (`test_weight_publishers.py`, `tests/integration/test_weight_broadcast.py`)."""

import asyncio
import contextlib
from collections import Counter

import pytest
import torch

from guirl.learner.publish import WeightDelivery
from guirl.messages.weights import WeightsFromDisk
from guirl.runtime.errors import ActorError
from guirl.weights.broadcast import WeightSyncError


class Recording:
    """A publisher that records its calls; `fail_send` makes `send` raise as a broken group does."""

    def __init__(self, name: str, fail_send: bool = False) -> None:
        self.name, self.fail_send, self.calls = name, fail_send, []

    def regroup(self, ranks: int) -> None:
        self.calls.append(("regroup", ranks))

    def prepare(self, version: int, state: dict) -> WeightsFromDisk:
        self.calls.append(("prepare", version, sorted(state)))
        return WeightsFromDisk(path=f"/{self.name}/v{version}")

    def send(self) -> int:
        self.calls.append(("send",))
        if self.fail_send:
            raise WeightSyncError("a peer left the group")
        return 8

    def close(self) -> None:
        self.calls.append(("close",))


def _deliver(broadcaster, *, ranks: int | None, answers: dict[str, bool]):
    """Deliver version 3 of a two-tensor state (LM head tied); what the broker was told, the counters, and
    the delivery's result or error."""
    told: list[str] = []

    async def tell(source) -> bool:
        told.append(source.path)
        return answers[source.path.split("/")[1]]

    async def live_ranks() -> int:
        return ranks

    counters: Counter = Counter()
    disk = Recording("disk")
    delivery = WeightDelivery(
        disk, broadcaster, counters=counters, busy=lambda what: contextlib.nullcontext()
    )
    state = {"embed.weight": torch.ones(2, 2), "lm_head.weight": torch.ones(2, 2)}
    try:
        result = asyncio.run(
            delivery.deliver(
                3, state, tied=True, tell=tell, live_ranks=live_ranks if ranks is not None else None
            )
        )
    except ActorError as exc:
        result = exc
    finally:
        delivery.shutdown()
    return told, counters, disk, result


def test_a_working_broadcast_is_all_there_is():
    bcast = Recording("bcast")
    told, counters, disk, _ = _deliver(bcast, ranks=2, answers={"bcast": True})
    assert told == ["/bcast/v3"] and disk.calls == []
    assert bcast.calls == [("regroup", 2), ("prepare", 3, ["embed.weight"]), ("send",)]  # the tied head stays
    assert counters["publish.broadcast_failed"] == 0


def test_a_broken_broadcast_falls_back_to_disk_and_closes_its_group():
    bcast = Recording("bcast", fail_send=True)
    told, counters, disk, result = _deliver(bcast, ranks=2, answers={"bcast": True, "disk": True})
    assert told == ["/bcast/v3", "/disk/v3"] and counters["publish.broadcast_failed"] == 1
    assert bcast.calls[-1] == ("close",) and disk.calls == [("prepare", 3, ["embed.weight"]), ("send",)]
    assert not isinstance(result, Exception)


def test_engines_that_did_not_take_the_broadcast_get_it_from_disk():
    bcast = Recording("bcast")
    told, counters, disk, _ = _deliver(bcast, ranks=1, answers={"bcast": False, "disk": True})
    assert told == ["/bcast/v3", "/disk/v3"] and bcast.calls[-1] == ("close",)
    assert counters["publish.broadcast_failed"] == 0  # the group worked; the broker abandoned the update


@pytest.mark.parametrize("ranks", [0, None])
def test_no_engine_to_join_or_no_broker_is_the_disk_path(ranks):
    bcast = Recording("bcast")
    told, _, disk, _ = _deliver(bcast, ranks=ranks, answers={"disk": True})
    assert told == ["/disk/v3"] and bcast.calls == [] and disk.calls[0][0] == "prepare"


def test_a_version_no_path_delivered_is_an_error():
    told, _, _, result = _deliver(Recording("bcast"), ranks=1, answers={"bcast": False, "disk": False})
    assert told == ["/bcast/v3", "/disk/v3"]
    assert isinstance(result, ActorError) and "did not take version 3" in str(result)
