"""`bench/broker.py --sglang` runs small (one SGLang stand-in with the timing backend, 2 and 4 concurrent
requests, one round of short windows, a fast latency model) so that it cannot rot: it exits 0 and its JSON
line reports every point of both modes, with the engine's latency matched to the clients' requests. No
speed is asserted."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from guirl.config.schema import ENV_VARS

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {
    "requests_per_s",
    "completed_per_s",
    "requests",
    "matched",
    "client_p50_s",
    "client_p95_s",
    "engine_p50_s",
    "added_p50_ms",
    "added_p50_frac",
    "cpu_cores_busy",
    "sim_lag_ms_mean",
    "sim_gpu_busy",
    "sim_prefill_share",
}


def test_sglang_broker_bench_reports_every_point() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    timing = json.dumps({"length_median": 8, "decode_s_base": 0.005, "prefill_s_per_token": 1e-5})
    cmd = [sys.executable, str(ROOT / "bench" / "broker.py"), "--sglang", "--standins", "1", "--rounds", "1"]
    cmd += ["--concurrency", "2,4", "--warm", "0.3", "--window", "1.0", "--timing", timing]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["bench"] == "broker_sglang"
    setup = result["setup"]
    assert (setup["standins"], setup["rounds"], setup["concurrency"]) == (1, 1, [2, 4])
    assert setup["timing"] == json.loads(timing) and setup["prompt_tokens"] > 1000
    assert set(result["points"]) == {"barrier", "streaming"}
    for mode, by_c in result["points"].items():
        assert set(by_c) == {"2", "4"}, mode
        for c, p in by_c.items():
            assert set(p) == FIELDS, (mode, c)
            assert p["requests"] > 0 and p["requests_per_s"] > 0 and p["completed_per_s"] >= 0, (mode, c, p)
            # every counted request was matched to the stand-in's record of it
            assert p["matched"] == p["requests"], (mode, c, p)
            assert p["engine_p50_s"] > 0 and math.isfinite(p["added_p50_ms"]), (mode, c, p)
            assert p["client_p50_s"] <= p["client_p95_s"], (mode, c, p)
            assert 0 < p["engine_p50_s"] <= p["client_p95_s"], (mode, c, p)
            assert 0 < p["sim_gpu_busy"] <= 1.01 and 0 < p["sim_prefill_share"] < 1, (mode, c, p)
    assert set(result["speedup_streaming_vs_barrier"]) == {"2", "4"}
    met = result["target_met"]
    assert met["requests_per_s_1.5x_at_64"] is None  # 64 concurrent was not measured
    assert isinstance(met["added_latency_p50_le_5pct"], bool)
