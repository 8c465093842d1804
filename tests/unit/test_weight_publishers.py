"""The learner's weight publishers (`guirl.weights`): what each one's `prepare` makes ready and the source
it tells the engines. (Sending over a real group: tests/integration/test_learner_actor.py,
test_weight_broadcast.py, tests/contract/test_sglang_weights.py.)"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import load_file

from guirl.messages.weights import SGLangBucket, WeightsFromBroadcast, WeightsFromDisk, WeightSource
from guirl.weights.broadcast_publisher import GuirlLayoutPublisher, SGLangLayoutPublisher
from guirl.weights.disk import DiskPublisher


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(8, 4, generator=gen),
        "norm.weight": torch.ones(4),
        "position_ids": torch.arange(8),
    }


def _valid(source: WeightSource) -> WeightSource:
    """What the broker would decode: the source passes the wire's checks."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(source), type=WeightSource)


def test_disk_writes_each_version_once_per_epoch_and_prunes_older_ones(tmp_path: Path) -> None:
    state = _state()
    disk = DiskPublisher(tmp_path / "weights", epoch=0)
    assert not (tmp_path / "weights").exists()  # nothing until a version is published
    source = disk.prepare(1, state)
    assert source == WeightsFromDisk(path=str(tmp_path / "weights" / "v000001")) == _valid(source)
    assert disk.send() == 0
    loaded = load_file(str(Path(source.path) / "model.safetensors"))
    assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state)
    assert (Path(source.path) / "epoch").read_text() == "0"

    marker = Path(source.path) / "model.safetensors"
    marker.write_bytes(b"a broker may be loading this")
    assert disk.prepare(1, state) == source and marker.read_bytes() == b"a broker may be loading this"
    again = DiskPublisher(tmp_path / "weights", epoch=1)  # a restarted learner: other weights, same number
    assert again.prepare(1, state) == source and marker.read_bytes() != b"a broker may be loading this"
    assert (Path(source.path) / "epoch").read_text() == "1"

    again.prepare(2, state)
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v000002"]


def test_guirl_layout_tells_a_group_of_the_live_engines_without_a_plan() -> None:
    pub = GuirlLayoutPublisher(host="127.0.0.1", timeout_s=7.0, join_timeout_s=3.0, dtype="bfloat16")
    pub.regroup(2)
    source = pub.prepare(5, _state())
    assert isinstance(source, WeightsFromBroadcast) and _valid(source) == source
    group = source.group
    assert (group.layout, group.world_size, group.host, group.backend) == ("guirl", 3, "127.0.0.1", "gloo")
    assert (group.timeout_s, group.join_timeout_s) == (7.0, 3.0) and group.group_name.startswith(
        "guirl-weights-"
    )
    assert source.buckets == []
    pub.regroup(2)
    assert pub.prepare(6, _state()).group == group  # the same engines: the same group, joined once
    pub.regroup(1)  # an engine went down: a group of the ones up, under a fresh name
    moved = pub.prepare(7, _state()).group
    assert moved.world_size == 2 and moved.group_name != group.group_name
    pub.close()
    assert pub.group is None
    with pytest.raises(RuntimeError, match="without a prepared version"):
        pub.send()


def test_sglang_layout_tells_the_bucket_plan_of_the_cast_state() -> None:
    state = _state()
    pub = SGLangLayoutPublisher(host="127.0.0.1", dtype="bfloat16", bucket_bytes=64, flattened=False)
    source = pub.prepare(1, state)
    assert isinstance(source, WeightsFromBroadcast) and _valid(source) == source
    assert source.group.layout == "sglang" and source.group.world_size == 2
    # by hand: 64 bytes per bucket; embed.weight is 8x4 bfloat16 = 64 bytes (a bucket of its own), then
    # norm.weight (8 bytes) cannot share with position_ids (8 x int64 = 64 bytes, cast left alone)
    assert source.buckets == [
        SGLangBucket(names=["embed.weight"], dtypes=["bfloat16"], shapes=[[8, 4]]),
        SGLangBucket(names=["norm.weight"], dtypes=["bfloat16"], shapes=[[4]]),
        SGLangBucket(names=["position_ids"], dtypes=["int64"], shapes=[[8]]),
    ]
    pub.close()
