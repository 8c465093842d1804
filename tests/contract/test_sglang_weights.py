"""guirl's learner broadcasting weights to SGLang's own receiving code: two SGLang servers of different
tensor-parallel sizes (1 and 2: three ranks, each SGLang's scheduler-side manager over its model runner's
`WeightUpdater`) join guirl's weight group with the bodies guirl's engine sends, receive every bucket per
tensor and flattened, bit-exact, inside a weight-update session; SGLang refuses an update outside one and a
group name it still holds, and guirl never hands out a name twice."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from guirl.inference.sglang_api import bucket_body, init_group_body
from guirl.net import free_port
from guirl.weights.broadcast import (
    WeightGroupSpec,
    WeightGroupTimeout,
    WeightSender,
    sglang_buckets,
    unique_group_name,
)
from tests.contract.sglang_ranks import Server
from tests.helpers import shared_tiny

INIT, DESTROY = "/init_weights_update_group", "/destroy_weights_update_group"
BEGIN, END, UPDATE = "/begin_weight_update", "/end_weight_update", "/update_weights_from_distributed"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory):
    ckpt = str(shared_tiny(tmp_path_factory))
    one, two = Server(ckpt, 1), Server(ckpt, 2)
    try:
        one.wait_ready()
        two.wait_ready()
        yield one, two
    finally:
        one.close()
        two.close()


def _state() -> dict[str, torch.Tensor]:
    """Tensors of every element size a checkpoint has, in an order that packs them unaligned if taken
    as they come (the plan must reorder them for SGLang's flattened buckets)."""
    gen = torch.Generator().manual_seed(0)
    return {
        "model.norm.weight": torch.randn(7, generator=gen).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(33, 5, generator=gen),
        "model.layers.0.input_layernorm.weight": torch.randn(9, generator=gen).to(torch.float16),
        "model.embed_tokens.weight": torch.randn(40, 8, generator=gen),
        "model.rotary.inv_freq": torch.arange(3, dtype=torch.int64),
        "lm_head.weight": torch.randn(40, 8, generator=gen).to(torch.bfloat16),
    }


def _group(world_size: int) -> WeightGroupSpec:
    return WeightGroupSpec(
        host="127.0.0.1",
        port=free_port(),
        world_size=world_size,
        group_name=unique_group_name(),
        layout="sglang",
        timeout_s=60,
    )


def _join(servers, spec: WeightGroupSpec) -> WeightSender:
    """Every server asked to join (rank offsets 1, then after the first server's TP ranks), the learner
    opening the group meanwhile; every rank must say it joined."""
    offset = 1
    for server in servers:
        server.send(INIT, init_group_body(spec, offset))
        offset += len(server.ranks)
    assert offset == spec.world_size
    sender = WeightSender()
    sender.open(spec)
    for server in servers:
        assert server.replies() == [(True, "Succeeded to initialize custom process group.")] * len(
            server.ranks
        )
    return sender


def _as_data(state: dict[str, torch.Tensor], names: list[str]) -> list:
    return [
        (
            n,
            str(state[n].dtype).removeprefix("torch."),
            list(state[n].shape),
            state[n].contiguous().view(-1).view(torch.uint8).tolist(),
        )
        for n in names
    ]


@pytest.mark.parametrize("flattened", [True, False], ids=["flattened", "per_tensor"])
def test_sglang_ranks_of_two_tp_sizes_receive_guirls_broadcast(servers, flattened: bool) -> None:
    state = _state()
    buckets = sglang_buckets(state, bucket_bytes=700)  # several buckets, mixed dtypes within them
    assert len(buckets) >= 3 and any(len({*b.dtypes}) > 1 for b in buckets)
    spec = _group(1 + 1 + 2)
    sender = _join(servers, spec)
    try:
        for server in servers:
            assert server.call(BEGIN, {}) == [(True, "Success")] * len(server.ranks)
        for version in (1, 2):
            for bucket in buckets:
                for server in servers:
                    server.send(UPDATE, bucket_body(bucket, spec.group_name, version, flattened=flattened))
                sender.send_sglang_bucket(state, bucket, flattened=flattened)
                for server in servers:
                    assert server.replies() == [(True, "Succeeded to update parameter online.")] * len(
                        server.ranks
                    )
            want = _as_data(state, [n for b in buckets for n in b.names])
            for server in servers:
                for rank in server.ranks:
                    assert rank.ask("loaded") == want  # every rank of every TP size, bit-exact, in plan order
            state = {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}
        for server in servers:
            assert server.call(END, {}) == [(True, "Success")] * len(server.ranks)
            assert server.ranks[0].ask("versions")[-1] == "2"  # the version guirl named with each bucket
    finally:
        sender.close()
        for server in servers:
            assert all(ok for ok, _ in server.call(DESTROY, {"group_name": spec.group_name}))


def test_sglang_refuses_an_update_outside_a_session_and_a_name_it_holds(servers) -> None:
    one, _ = servers
    spec = _group(2)
    sender = _join([one], spec)
    try:
        bucket = sglang_buckets(_state())[0]
        one.send(UPDATE, bucket_body(bucket, spec.group_name, 1, flattened=True))
        ((ok, message),) = one.replies()
        assert not ok and "between begin_weight_update() and end_weight_update()" in message
        assert one.ranks[0].ask("loaded") == []
        # the same name again, for another group (another learner port): refused while the first lives
        again = WeightGroupSpec(
            host="127.0.0.1",
            port=free_port(),
            world_size=2,
            group_name=spec.group_name,
            layout="sglang",
            timeout_s=5,
        )
        refused = WeightSender()  # the learner of the second group listens (SGLang meets it, then refuses)
        with ThreadPoolExecutor(1) as pool:
            opening = pool.submit(refused.open, again)
            ((ok, message),) = one.call(INIT, init_group_body(again, 1))
            with pytest.raises(WeightGroupTimeout):
                opening.result()
        assert not ok and "already been created" in message, message
        # a session cannot be opened twice, and ending one that is not open is refused
        assert one.call(BEGIN, {}) == [(True, "Success")]
        ((ok, message),) = one.call(BEGIN, {})
        assert not ok and "already open" in message  # what guirl's engine looks for to end a stale session
        assert one.call(END, {}) == [(True, "Success")]
        ((ok, _),) = one.call(END, {})
        assert not ok
    finally:
        sender.close()
        assert one.call(DESTROY, {"group_name": spec.group_name}) == [
            (True, "Succeeded to destroy custom process group.")
        ]
    names = {unique_group_name() for _ in range(1000)}
    assert len(names) == 1000 and spec.group_name not in names


def test_bodies_sglang_would_not_parse_are_refused(servers) -> None:
    one, _ = servers
    with pytest.raises(RuntimeError, match="ValidationError"):
        one.ranks[0].ask("call", INIT, {"master_address": "127.0.0.1", "master_port": "not a port"})
    with pytest.raises(RuntimeError, match="ValidationError"):
        one.ranks[0].ask("call", UPDATE, {"names": ["x"]})  # no dtypes, no shapes
