"""Each role's spec (`guirl.roles`) carries options its actor accepts — checked as the supervisor checks
them, before any process starts — holding the config's values for that role."""

from pathlib import Path

import msgspec
import pytest

from guirl import roles
from guirl.config import load_config
from guirl.placement import plan
from guirl.runtime.process import ActorOptionsError, ActorSpec, check_options

RUN = Path("/runs/r1")


def _cfg(*overrides: str):
    return load_config(None, env={}, overrides=list(overrides))


def test_the_broker_gets_the_inference_section_and_the_judge():
    cfg = _cfg("inference.max_batch=3", "prm.enabled=true", "prm.votes=5")
    opts = check_options(
        roles.broker_spec(cfg, "/ckpt", RUN, judge_ckpt="/judge", placement=plan(cfg, "train"))
    )
    assert opts.inference == cfg.inference and opts.ckpt == "/ckpt" and opts.log_dir == "/runs/r1/logs"
    assert opts.judge.prm.votes == 5 and opts.judge.ckpt == "/judge"
    assert check_options(roles.broker_spec(cfg, "", RUN)).judge is None


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_a_worker_spec_per_mode(mode):
    cfg = _cfg("env.prewarm_envs=2", "faults.kill_vm_at_step=3", "prm.history_images=2")
    peers = roles.Peers(
        coordinator="tcp://c:1",
        broker="tcp://b:2",
        learner="tcp://l:3" if mode == "train" else "",
        prm="tcp://p:4" if mode == "train" else "",
    )
    make_worker = roles.worker_specs(cfg, RUN, peers, mode=mode)
    first, second = (check_options(make_worker(i, 3, 2)) for i in (0, 1))
    assert make_worker(0, 3).target == "guirl.actors.env_worker:EnvWorker" and first.vms == 3
    assert (first.coordinator, first.broker, first.learner) == ("tcp://c:1", "tcp://b:2", peers.learner)
    assert first.agent == cfg.agent and first.env == cfg.env and first.cloud is None  # local: no cloud keys
    if mode == "eval":  # the VM fault strikes the first worker's first episode only; prewarm is eval's
        assert (first.fault_kill_vm_at_step, second.fault_kill_vm_at_step, first.prewarm) == (3, -1, 2)
    else:
        assert (first.fault_kill_vm_at_step, first.prewarm, first.prm_history_images) == (-1, None, 2)


def test_gui_r1_mode_gets_dataset_workers_with_the_data_section():
    cfg = _cfg("data.train=rows.jsonl", "data.format_weight=0.3")
    spec = roles.worker_specs(cfg, RUN, roles.Peers("tcp://c:1", "tcp://b:2"), mode="train")(0, 1)
    assert spec.target == "guirl.actors.dataset_worker:DatasetWorker"
    assert check_options(spec).data.format_weight == 0.3


def test_a_cloud_worker_carries_the_cloud_section():
    cfg = _cfg("env.provider=aws", "cloud.aws.image_id=ami-1")
    opts = check_options(
        roles.worker_specs(cfg, RUN, roles.Peers("tcp://c:1", "tcp://b:2"), mode="eval")(0, 1)
    )
    assert opts.cloud.aws.image_id == "ami-1"


def test_the_prm_sends_scores_to_the_learner_only_when_it_trains_on_them():
    assert check_options(roles.prm_spec(_cfg(), RUN, "tcp://b:2", "tcp://l:3")).learner == ""
    opts = check_options(roles.prm_spec(_cfg("train.advantage=step_wise"), RUN, "tcp://b:2", "tcp://l:3"))
    assert opts.learner == "tcp://l:3"


def test_options_a_role_does_not_take_are_refused():
    spec = roles.prm_spec(_cfg(), RUN, "tcp://b:2", "")
    bad = msgspec.structs.replace(spec, options={**spec.options, "judge_votes": 3})
    with pytest.raises(ActorOptionsError, match="actor prm .*: unknown option 'judge_votes'"):
        check_options(bad)
    nested = msgspec.structs.replace(spec, options={**spec.options, "prm": {"votes": "five"}})
    with pytest.raises(ActorOptionsError, match=r"option 'prm.votes': expected `int`, got `str`"):
        check_options(nested)
    with pytest.raises(ActorOptionsError, match="missing option 'broker'"):
        check_options(ActorSpec(name="prm", target=spec.target, options={"run_dir": "/r"}))
    with pytest.raises(ActorOptionsError, match="cannot load"):
        check_options(ActorSpec(name="x", target="guirl.actors.nothing:Here"))


def test_the_learner_gets_train_and_the_weight_transport_of_its_backend():
    cfg = _cfg("inference.backend=hf", "train.lr=0.5", "rollout.batch_size=3", "inference.engines=2")
    opts = check_options(roles.learner_spec(cfg, RUN, "/ckpt", "tcp://b:2", "tcp://c:1", plan(cfg, "train")))
    assert opts.train.lr == 0.5 and (opts.batch_size, opts.engines, opts.device) == (3, 2, "cpu")
    assert (opts.weights.layout, opts.weights.backend) == ("guirl", "gloo") and opts.resume_from == ""
    sglang = _cfg(
        "inference.backend=sglang",
        'inference.sglang.urls=["http://a:1", "http://b:1"]',
        "inference.sglang.tp_size=2",
        "train.device=cuda",
    )
    opts = check_options(roles.learner_spec(sglang, RUN, "/ckpt", "tcp://b:2", "tcp://c:1", None, RUN / "v3"))
    assert (opts.weights.layout, opts.weights.backend, opts.weights.dtype) == ("sglang", "nccl", "bfloat16")
    assert opts.engines == 4 and opts.device == "cuda" and opts.resume_from == "/runs/r1/v3"


def test_a_run_refuses_a_bad_option_before_starting_anything(tmp_path):
    """An option the role does not take is an input error (exit 2) naming it, not "did not start": no
    process was started, so there is no log to look at."""
    from guirl.cluster.run import ClusterRun
    from guirl.errors import RunError
    from tests.helpers import run

    cfg = _cfg()
    cluster = ClusterRun.local(cfg)
    spec = roles.prm_spec(cfg, tmp_path, "tcp://b:2", "")
    bad = msgspec.structs.replace(spec, options={**spec.options, "judge_votes": 3})
    worker = roles.worker_specs(cfg, tmp_path, roles.Peers("tcp://c:1", "tcp://b:2"), mode="eval")

    def bad_worker(i, vms, prewarm=0):
        spec = worker(i, vms, prewarm)
        return msgspec.structs.replace(spec, options={**spec.options, "vm": 1})

    async def main() -> None:
        coord = roles.coordinator(cfg, tmp_path, "eval", [])
        async with roles.RunActors(cfg, tmp_path, cluster, coord, "eval") as actors:
            with pytest.raises(ActorOptionsError, match="unknown option 'judge_votes'") as err:
                await actors.start(bad)
            assert not isinstance(err.value, RunError)
            for together in (True, False):
                with pytest.raises(ActorOptionsError, match="unknown option 'vm'"):
                    await actors.start_workers(bad_worker, together=together)
            assert actors.sup.actors == {}

    run(main(), timeout=60)
