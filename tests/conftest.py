"""The suite's order (its longest files first), and its shared fixtures.

`make test` runs files on two pytest-xdist workers (`--dist loadfile --no-loadscope-reorder`: files are
handed out in collection order, not xdist's default of most tests first). A file of several minutes handed
out last keeps one worker busy while the other idles; handed out first, the short files fill in around it
and both workers end together. The list holds the files that each take over a minute on 2 cores (measured
with `--durations`: the sum of their tests), longest first; every other file keeps its place after them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import pytest

# No run of the suite logs to W&B with the caller's own credentials (runs left on `wandb.mode = "auto"`
# go online whenever W&B's key is found): its tests give their own, against a loopback stand-in.
os.environ["NETRC"] = os.devnull
for _name in ("WANDB_API_KEY", "WANDB_KEY", "WANDB_MODE"):
    os.environ.pop(_name, None)

# One torch thread per process (the caller's own setting kept): a test starts several processes that compute
# at once (broker, learner ranks, judge, two workers of the suite) on a machine of 2 cores, where each
# process's own pool of 2 threads only contends and spins; measured on `bench/learning.py --quick`: 15 %
# less CPU time. Tests of thread settings set them themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")

LONGEST_FIRST = (
    "tests/chaos/test_chaos.py",
    "tests/e2e/test_train.py",
    "tests/e2e/test_cluster.py",
    "tests/e2e/test_train_prm.py",
    "tests/integration/test_shipped_tasks.py",
    "tests/e2e/test_eval.py",
    "tests/e2e/test_learning_bench.py",
    "tests/e2e/test_train_faults.py",
    "tests/e2e/test_desktop_learning.py",
    "tests/contract/test_osworld_server.py",
    "tests/e2e/test_gui_r1.py",
    "tests/integration/test_learner_ranks.py",
    "tests/integration/test_sglang_engine.py",
    "tests/integration/test_parity_media.py",
)


def pytest_collection_modifyitems(session, config, items) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest as is


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory) -> str:
    """The tiny checkpoint's path (`shared_tiny`: built once per run of the suite)."""
    from tests.helpers import shared_tiny

    return str(shared_tiny(tmp_path_factory))


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    """For a test that calls `setup_logging` in the test process (directly, or through a CLI command run
    in-process): it replaces the root logger's handlers, pytest's own among them; they are put back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
