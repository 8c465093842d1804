"""Weight broadcast over the learner → engine group on gloo: this process is the learner's rank 0, a
spawned process is one engine (rank 1) that receives each broadcast in full (header, buckets, unflatten)
and acknowledges it over a pipe. Two models, built in memory (random weights, no checkpoint written):
the tiny Qwen3-VL (~1 M parameters) and a ~100 M-parameter Qwen3-VL (text hidden 768, 6 layers, 32k
vocabulary), in fp32 and bf16, with buckets of 4, 16 and 64 MiB (the bucket size only governs how the
tensors under 1 MiB are packed: larger ones always travel alone, in place; see guirl/weights/broadcast.py).

Both processes run torch with one thread (see `main`). `send_s` is rank 0's own `broadcast` time (it
returns once its sends are handed to gloo); `delivered_s` runs until the engine has every tensor in
memory (the acknowledgement's pipe hop is ~0.1 ms), and the bandwidth is the payload over
`delivered_s`. The first broadcast of each case is checked bit-identical (sha256 on both sides) and not
timed. Median of `--reps`. Then SGLang's layout (the `sglang` backend's), side by side with guirl's on
the same state: no header, the bucket plan told to the engine out of band (over the pipe here, over HTTP
to an SGLang server), one collective per bucket (`flattened_bucket`) or one per tensor (`per_tensor`).
Prints a table, then one line of JSON.

    python bench/weights.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from multiprocessing.connection import Connection

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from guirl.weights.broadcast import (  # noqa: E402
    WeightGroupSpec,
    WeightReceiver,
    WeightSender,
    sglang_buckets,
    state_digest,
)

MiB = 1 << 20
CASES = [  # (model, dtype, bucket MiB)
    ("tiny", "float32", 64),
    ("100M", "float32", 4),
    ("100M", "float32", 16),
    ("100M", "float32", 64),
    ("100M", "bfloat16", 16),
    ("100M", "bfloat16", 64),
]


def tiny_shapes() -> dict[str, torch.Tensor]:
    from guirl.model.tiny import build_tokenizer, tiny_config

    return _meta_state(tiny_config(build_tokenizer()))


def hundred_m_shapes() -> dict[str, torch.Tensor]:
    from transformers import Qwen3VLConfig

    config = Qwen3VLConfig(
        text_config={
            "vocab_size": 32768,
            "hidden_size": 768,
            "intermediate_size": 2048,
            "num_hidden_layers": 6,
            "num_attention_heads": 12,
            "num_key_value_heads": 4,
            "head_dim": 64,
            "max_position_embeddings": 32768,
            "rope_parameters": {  # mrope_section sums to head_dim / 2
                "rope_type": "default",
                "rope_theta": 1e6,
                "mrope_section": [12, 10, 10],
                "mrope_interleaved": True,
            },
        },
        vision_config={
            "depth": 2,
            "hidden_size": 384,
            "intermediate_size": 1536,
            "num_heads": 6,
            "patch_size": 16,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "out_hidden_size": 768,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [1],
        },
        tie_word_embeddings=False,
    )
    return _meta_state(config)


def _meta_state(config: object) -> dict[str, torch.Tensor]:
    """The model's state dict on the meta device: its names and shapes, no memory, no init time."""
    from transformers import Qwen3VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen3VLForConditionalGeneration(config)
    return model.state_dict()


def random_state(shapes: dict[str, torch.Tensor], dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=gen).to(dtype) for k, v in shapes.items()}


def engine(spec: WeightGroupSpec, conn: Connection) -> None:
    """Rank 1: receive whatever comes; ack each with its version (and the digest when asked)."""
    torch.set_num_threads(1)  # see main()
    receiver = WeightReceiver()
    receiver.open(spec, rank=1)
    try:
        while (command := conn.recv()) != "stop":
            version, state = receiver.receive()
            conn.send((version, state_digest(state) if command == "digest" else ""))
            del state
    finally:
        receiver.close()


def sglang_engine(spec: WeightGroupSpec, conn: Connection) -> None:
    """Rank 1 of an SGLang-layout group: each command is a bucket plan to receive (as a server's
    `update_weights_from_distributed` requests would be); ack with the digest when asked."""
    torch.set_num_threads(1)
    receiver = WeightReceiver()
    receiver.open(spec, rank=1)
    try:
        while (command := conn.recv()) != "stop":
            plan, flattened, digest = command
            state: dict[str, torch.Tensor] = {}
            for b in plan:
                state.update(receiver.receive_sglang_bucket(b, flattened=flattened))
            conn.send(state_digest(state) if digest else "")
            del state
    finally:
        receiver.close()


def sglang_layout(state: dict[str, torch.Tensor], bucket_mib: int, reps: int) -> list[dict]:
    """SGLang's layout, flattened and per tensor, on `state`: the median of `reps` after a checked round."""
    spec = WeightGroupSpec("127.0.0.1", free_port(), world_size=2, timeout_s=120, layout="sglang")
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=sglang_engine, args=(spec, child), daemon=True)
    proc.start()
    sender = WeightSender()
    sender.open(spec)
    payload = sum(t.numel() * t.element_size() for t in state.values())
    rows = []
    try:
        for flattened in (True, False):
            delivered_s = []
            for rep in range(reps + 1):
                started = time.perf_counter()
                plan = sglang_buckets(state, bucket_mib * MiB)
                conn.send((plan, flattened, rep == 0))
                for b in plan:
                    sender.send_sglang_bucket(state, b, flattened=flattened)
                digest = conn.recv()
                if rep == 0:
                    assert digest == state_digest(state), "sglang layout: weights differ"
                else:
                    delivered_s.append(time.perf_counter() - started)
            med = statistics.median(delivered_s)
            rows.append(
                {
                    "layout": "sglang-flattened" if flattened else "sglang-per-tensor",
                    "bucket_mib": bucket_mib,
                    "collectives": len(plan) if flattened else sum(len(b.names) for b in plan),
                    "delivered_s": round(med, 4),
                    "gbytes_per_s": round(payload / med / 1e9, 3),
                    "bit_identical": True,
                }
            )
        conn.send("stop")
        proc.join(60)
    finally:
        sender.close()
        if proc.is_alive():
            proc.kill()
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    # The bucket copies are memory-bound: one thread does them at full speed, while two OpenMP threads on a
    # busy 2-core machine stall at every barrier for a scheduler slice (measured: 8 ms per 6 MB copy).
    torch.set_num_threads(1)

    spec = WeightGroupSpec("127.0.0.1", free_port(), world_size=2, timeout_s=120)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=engine, args=(spec, child), daemon=True)
    proc.start()
    sender = WeightSender()
    sender.open(spec)
    shapes = {"tiny": tiny_shapes(), "100M": hundred_m_shapes()}
    version = 0
    rows = []
    try:
        for model, dtype_name, bucket_mib in CASES:
            state = random_state(shapes[model], getattr(torch, dtype_name), seed=len(rows))
            params = sum(t.numel() for t in state.values())
            payload = sum(t.numel() * t.element_size() for t in state.values())
            send_s, delivered_s = [], []
            for rep in range(args.reps + 1):
                version += 1
                check = rep == 0  # warm-up round: checked, not timed
                conn.send("digest" if check else "time")
                started = time.perf_counter()
                stats = sender.broadcast(state, version, bucket_bytes=bucket_mib * MiB)
                got_version, digest = conn.recv()
                delivered = time.perf_counter() - started
                assert got_version == version
                if check:
                    assert digest == state_digest(state), f"{model} {dtype_name}: weights differ"
                else:
                    send_s.append(stats.seconds)
                    delivered_s.append(delivered)
            med = statistics.median(delivered_s)
            rows.append(
                {
                    "model": model,
                    "dtype": dtype_name,
                    "bucket_mib": bucket_mib,
                    "params": params,
                    "tensors": stats.tensors,
                    "buckets": stats.buckets,
                    "mbytes": round(payload / 1e6, 2),
                    "send_s": round(statistics.median(send_s), 4),
                    "delivered_s": round(med, 4),
                    "gbytes_per_s": round(payload / med / 1e9, 3),
                    "bit_identical": True,
                }
            )
        conn.send("stop")
        proc.join(60)
    finally:
        sender.close()
        if proc.is_alive():
            proc.kill()

    print(f"gloo over loopback, 1 sender + 1 engine process, {os.cpu_count()} CPUs, median of {args.reps}")
    print(
        f"{'model':>6} {'dtype':>9} {'bucket':>7} {'params':>12} {'tensors':>7} {'buckets':>7} {'MB':>8} "
        f"{'send s':>8} {'deliv s':>8} {'GB/s':>6}"
    )
    for r in rows:
        print(
            f"{r['model']:>6} {r['dtype']:>9} {r['bucket_mib']:>4}MiB {r['params']:>12,} {r['tensors']:>7} "
            f"{r['buckets']:>7} {r['mbytes']:>8.1f} {r['send_s']:>8.4f} {r['delivered_s']:>8.4f} "
            f"{r['gbytes_per_s']:>6.2f}"
        )
    state = random_state(shapes["100M"], torch.bfloat16, seed=99)
    guirl_row = next(
        r for r in rows if r["model"] == "100M" and r["dtype"] == "bfloat16" and r["bucket_mib"] == 64
    )
    layouts = sglang_layout(state, 64, args.reps)
    print("\n100M bf16, 64 MiB buckets, by layout (delivered s, ratio to guirl's):")
    print(f"  guirl             {guirl_row['delivered_s']:.4f}  1.00x  ({guirl_row['buckets']} collectives)")
    for r in layouts:
        r["ratio_to_guirl"] = round(r["delivered_s"] / guirl_row["delivered_s"], 2)
        print(
            f"  {r['layout']:<18}{r['delivered_s']:.4f}  {r['ratio_to_guirl']:.2f}x"
            f"  ({r['collectives']} collectives)"
        )
    print(
        json.dumps(
            {"bench": "weights", "backend": "gloo", "reps": args.reps, "cases": rows, "layouts": layouts}
        )
    )


if __name__ == "__main__":
    main()
