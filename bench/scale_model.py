"""Where a cluster of 1,000 to 10,000 desktops saturates first: a model, not a measurement, computed from the
per-step costs measured on this machine (`bench/control_plane.py`, `bench/broker_render.py`) and from the
GPU figures given as inputs (they cannot be measured without GPUs: measure them with
`bench/broker_sglang.py` and `bench/gpu_check.py` on the cluster, and pass them in).

For a layout (desktops, a step period each desktop would take with an idle control plane, rollout GPUs,
learner GPUs, brokers) each component's capacity is computed in env steps/s; the layout runs at the smallest,
and the component that sets it saturates first:

- rollout GPUs: `rollout_gpus x requests/s per GPU` (input: prefill-bound for screenshot prompts);
- brokers: each one process routing, and rendering the chat template on its engines' threads. The
  tokenizer's encode runs without Python's GIL, so the threads render on several cores; the rest of a
  render and all the messaging hold it. Per broker: `min(1 / (GIL-held render + messaging), cores /
  (render + messaging))`, with `--broker-cores` cores (and at least as many engines: one thread each);
- coordinator: one process, work per episode (hand-out, end, ledger) spread over the episode's steps;
- env workers: `cores x 1000 / env-worker ms per step` (they scale by adding processes and hosts; the figure
  says how many cores they need, not a ceiling);
- learner intake: bytes per trained step (prompt ids, one new screen, log-probs) against the learner host's
  network (input), and the learner's training throughput in tokens/s (input) against the tokens per step:
  what it cannot train in time it drops for staleness or leaves unused;
- weight broadcast: model bytes / bandwidth (inputs) per version, against the update period.

    python bench/scale_model.py [--desktops 1000,2000,5000,10000] [--period 5] [--rollout-gpus 8,16,32,64]
        [--gpu-requests-s 2.0] [--learner-gpus 8,64] [--learner-tokens-s-per-gpu 3000] [--brokers 1]
        [--broker-cores 4] [--screen 1920x1080 | 1280x800]
Prints a table, then one line of JSON.
"""

from __future__ import annotations

import argparse
import json

# measured here (2 cores; see docs/scale.md), per env step unless said otherwise
MEASURED = {
    "broker_messaging_ms": 0.85,  # bench/control_plane.py at 1,024 desktops (0.7-1.7 over the points)
    "broker_render_ms": 3.9,  # bench/broker_render.py: CPU per full-HD request timed alone (3.85; 4.4 once)
    "broker_render_gil_ms": 1.53,  # bench/broker_render.py: the most of a render that can hold the GIL
    "coordinator_ms_per_episode": 4.4,  # 0.55 ms per step over the bench's ~8-step episodes
    "env_worker_ms": {"1280x800": 5.2, "1920x1080": 115.0},  # the full-HD figure is the screen's resample
    "screen_kb": {"1280x800": 68.0, "1920x1080": 130.0},  # the prompt's PNG (level 1)
    "prompt_tokens": {"1280x800": 4121, "1920x1080": 7241},  # two history screens and the current one
}


def numbers(text: str, kind: type = int) -> list:
    return [kind(x) for x in text.split(",") if x.strip()]


def broker_capacity(cores: float) -> float:
    """Steps/s one broker process serves on the SGLang path with `cores` cores (see the module docstring)."""
    m = MEASURED
    serial = 1000.0 / (m["broker_render_gil_ms"] + m["broker_messaging_ms"])
    return min(serial, cores * 1000.0 / (m["broker_render_ms"] + m["broker_messaging_ms"]))


def layout(args: argparse.Namespace, desktops: int, rollout_gpus: int, learner_gpus: int) -> dict:
    screen = args.screen
    demand = desktops / args.period  # steps/s the desktops would make with nothing waiting
    per_broker = broker_capacity(args.broker_cores)
    tokens = MEASURED["prompt_tokens"][screen] + args.response_tokens
    step_bytes = tokens * 8 + MEASURED["screen_kb"][screen] * 1024  # ids and log-probs, one new screen
    capacity = {
        "rollout_gpus": rollout_gpus * args.gpu_requests_s,
        "brokers": args.brokers * per_broker,
        "coordinator": 1000.0 / MEASURED["coordinator_ms_per_episode"] * args.episode_steps,
        "learner_network": args.learner_gbit_s * 1e9 / 8 / step_bytes,
        "learner_training": learner_gpus * args.learner_tokens_s_per_gpu / tokens,
    }
    # the learner trains a share of what is played; rollout itself does not wait for it (decoupled)
    rollout = {k: v for k, v in capacity.items() if k != "learner_training"}
    first = min(rollout, key=rollout.get)
    rate = min(demand, rollout[first])
    broadcast_s = args.model_gb / args.broadcast_gb_s
    return {
        "desktops": desktops,
        "rollout_gpus": rollout_gpus,
        "learner_gpus": learner_gpus,
        "demand_steps_s": round(demand, 1),
        "steps_s": round(rate, 1),
        "step_period_s": round(desktops / rate, 2),
        "saturates_first": first if rollout[first] < demand else None,
        "capacity_steps_s": {k: round(v, 1) for k, v in capacity.items()},
        "env_worker_cores": round(rate * MEASURED["env_worker_ms"][screen] / 1000, 1),
        # for what the rest would let flow: the brokers a layout needs not to be its limit
        "brokers_needed": int(
            -(-min(demand, *(v for k, v in rollout.items() if k != "brokers")) // per_broker)
        ),
        "learner_trains_share": round(min(1.0, capacity["learner_training"] / max(rate, 1e-9)), 3),
        "broadcast_s_per_version": round(broadcast_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--desktops", type=numbers, default=[1000, 2000, 5000, 10000])
    ap.add_argument("--period", type=float, default=5.0, help="a desktop's step period, nothing waiting")
    ap.add_argument("--episode-steps", type=float, default=30.0)
    ap.add_argument("--rollout-gpus", type=numbers, default=[8, 16, 32, 64])
    ap.add_argument(
        "--gpu-requests-s", type=float, default=2.0, help="ASSUMED: requests/s one rollout GPU serves"
    )
    ap.add_argument("--learner-gpus", type=numbers, default=[8, 64])
    ap.add_argument(
        "--learner-tokens-s-per-gpu", type=float, default=3000.0, help="ASSUMED: training tokens/s per GPU"
    )
    ap.add_argument("--learner-gbit-s", type=float, default=25.0, help="ASSUMED: the learner host's network")
    ap.add_argument("--model-gb", type=float, default=16.0, help="weights per version (8 B params in bf16)")
    ap.add_argument("--broadcast-gb-s", type=float, default=20.0, help="ASSUMED: NCCL broadcast bandwidth")
    ap.add_argument("--response-tokens", type=int, default=200)
    ap.add_argument("--brokers", type=int, default=1)
    ap.add_argument("--broker-cores", type=float, default=4.0, help="cores each broker process may use")
    ap.add_argument("--screen", choices=sorted(MEASURED["env_worker_ms"]), default="1920x1080")
    args = ap.parse_args(argv)
    rows = [
        layout(args, d, r, lg) for d in args.desktops for r in args.rollout_gpus for lg in args.learner_gpus
    ]
    head = f"{'desktops':>8} {'rollout':>7} {'learner':>7} {'steps/s':>8} {'period':>7}  "
    print(head + f"{'first to saturate':<18} {'brokers':>7} {'env cores':>9} {'trained':>7}")
    for r in rows:
        print(
            f"{r['desktops']:>8} {r['rollout_gpus']:>7} {r['learner_gpus']:>7} {r['steps_s']:>8} "
            f"{r['step_period_s']:>6}s  {str(r['saturates_first']):<18} {r['brokers_needed']:>7} "
            f"{r['env_worker_cores']:>9} {r['learner_trains_share']:>7}"
        )
    print(json.dumps({"model": "scale", "inputs": vars(args), "measured": MEASURED, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
