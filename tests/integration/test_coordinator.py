"""The coordinator over real sockets: pull-based assignment, one end state per episode, retries of
environment errors up to a bound, refusal of unknown and repeated reports, lost workers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from guirl.actors.coordinator import Coordinator
from guirl.errors import InputError
from guirl.messages import CoordinatorChannel
from guirl.messages.types import (
    Ack,
    EpisodeAssignment,
    EpisodeDelivered,
    EpisodeEnded,
    EpisodeRejected,
    GroupsRetired,
    LearnerResumed,
    NoWork,
    Register,
    WeightsPublished,
    WorkRequest,
)
from guirl.report import train_summary
from guirl.vmpool.tasks.suite import SuiteError, SuiteTask, load_suite
from tests.helpers import client_actor, fast_config, run

SUITE = Path(__file__).resolve().parents[2] / "tasks" / "local"


def _tasks(n: int) -> list[SuiteTask]:
    return [SuiteTask(f"t{i}", "d" if i % 2 else "e", {"id": f"t{i}"}) for i in range(n)]


async def _with_coordinator(cfg, tasks, body, **kwargs):
    coord = Coordinator("coordinator", tasks=tasks, runtime=cfg.runtime, bind=["tcp://127.0.0.1:0"], **kwargs)
    task = await coord.start()
    try:
        async with client_actor(cfg) as client:
            conn = client.connect("coordinator", coord.endpoints[0], CoordinatorChannel)
            return await body(coord, conn)
    finally:
        coord.request_shutdown("test done")
        await asyncio.wait_for(task, 15)


def test_every_task_ends_once_with_retries_bounded():
    cfg = fast_config()

    async def body(coord, conn):
        assert isinstance(await conn.request(Register(role="env_worker", name="w")), Ack)
        a = await conn.request(WorkRequest(worker="w"))
        b = await conn.request(WorkRequest(worker="w"))
        assert isinstance(a, EpisodeAssignment) and isinstance(b, EpisodeAssignment)
        assert (a.task_id, b.task_id) == ("t0", "t1") and a.episode_id != b.episode_id
        assert a.max_steps == 7 and a.mode == "eval"
        # nothing left to hand out, but episodes run: wait, not done
        wait = await conn.request(WorkRequest(worker="w"))
        assert isinstance(wait, NoWork) and wait.reason != "done"
        # t0 completes; a repeated report and a report of an unknown episode are refused
        done = EpisodeEnded(episode_id=a.episode_id, status="completed", score=1.0, outcome="done", steps=3)
        assert (await conn.request(done)).ok
        assert not (await conn.request(done)).ok
        assert not (await conn.request(EpisodeEnded(episode_id="nope", status="completed"))).ok
        # t1 hits an environment error twice: retried as new episodes (attempt 1, 2), then aborted
        current = b
        for attempt in range(3):
            assert current.attempt == attempt and current.task_id == "t1"
            ended = EpisodeEnded(
                episode_id=current.episode_id, status="retried", env_error=f"vm died {attempt}"
            )
            assert (await conn.request(ended)).ok
            current = await conn.request(WorkRequest(worker="w"))
        assert isinstance(current, NoWork) and current.reason == "done"
        assert coord.all_done.is_set()
        t1 = coord.results[("t1#g", 0)]
        assert t1.status == "aborted" and t1.attempts == 3 and len(t1.env_errors) == 3
        assert coord.results[("t0#g", 0)].score == 1.0
        snap = coord.snapshot()
        assert snap["done"] == 2 and snap["success"] == 1 and snap["aborted"] == 1 and snap["env_errors"] == 3

    run(_with_coordinator(cfg, _tasks(2), body, max_attempts=3, max_steps=7))


def test_the_run_end_settles_folders_their_worker_left_unreported(tmp_path):
    """A worker killed between the coordinator taking an end and writing the answer leaves its folder
    `unreported`; the run's end gives it the ledger's word. A folder the ledger never heard of (the worker
    died before reporting) stays as it is, and a broken file is passed over."""
    cfg = fast_config()
    episodes = tmp_path / "episodes"

    def folder(task_id, episode_id, status="unreported"):
        path = episodes / task_id / episode_id / "result.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"episode_id": episode_id, "task_id": task_id, "status": status}))
        return path

    async def body(coord, conn):
        a = await conn.request(WorkRequest(worker="w"))
        b = await conn.request(WorkRequest(worker="w"))
        assert (await conn.request(EpisodeEnded(episode_id=a.episode_id, status="completed", score=1.0))).ok
        assert (await conn.request(EpisodeEnded(episode_id=b.episode_id, status="retried", env_error="x"))).ok
        paths = [folder(a.task_id, a.episode_id), folder(b.task_id, b.episode_id), folder("t9", "never-told")]
        broken = episodes / "t9" / "broken" / "result.json"
        broken.parent.mkdir()
        broken.write_text("{not json")
        assert coord.settle_unreported(episodes) == 2
        assert coord.settle_unreported(episodes) == 0  # settled once
        return [json.loads(p.read_text()) for p in paths]

    first, second, unknown = run(_with_coordinator(cfg, _tasks(2), body))
    assert first["status"] == "completed" and "ledger" in first["settled"]
    assert second["status"] == "retried" and unknown["status"] == "unreported" and "settled" not in unknown


def test_a_lost_worker_episodes_are_retried():
    cfg = fast_config()

    async def scenario():
        coord = Coordinator("coordinator", tasks=_tasks(1), runtime=cfg.runtime, bind=["tcp://127.0.0.1:0"])
        task = await coord.start()
        try:
            async with client_actor(cfg, "doomed") as client:
                conn = client.connect("coordinator", coord.endpoints[0], CoordinatorChannel)
                first = await conn.request(WorkRequest(worker="doomed"))
                assert isinstance(first, EpisodeAssignment)
            # the client is gone (its heartbeats stop): the coordinator declares it dead and retries
            while first.episode_id not in coord.ended:
                coord.progress.clear()
                await asyncio.wait_for(coord.progress.wait(), 10)
            assert coord.ended[first.episode_id].status == "retried"
            async with client_actor(cfg, "heir") as client:
                conn = client.connect("coordinator", coord.endpoints[0], CoordinatorChannel)
                again = await conn.request(WorkRequest(worker="heir"))
                assert again.task_id == first.task_id and again.attempt == 1
        finally:
            coord.request_shutdown("test done")
            await asyncio.wait_for(task, 15)

    run(scenario())


def test_a_sample_not_yet_at_the_learner_goes_out_again_when_its_worker_dies():
    """A completed training episode is held until its worker says the learner has it: the worker dying
    before that hands the sample out again (once); a delivered one is not. A repeated end report from the
    same worker is answered as the first; a sample handed back twice goes out once; and a late end from a
    worker taken for dead is refused."""
    cfg = fast_config()

    async def body(coord, conn):
        a, b = [await conn.request(WorkRequest(worker="w")) for _ in range(2)]  # one group of two
        for w in (a, b):
            ended = EpisodeEnded(episode_id=w.episode_id, status="completed", score=1.0, worker="w")
            assert (await conn.request(ended)).ok
            again = await conn.request(ended)  # its first answer lost: the same answer
            assert again.ok and "repeated" in again.note
        counts = coord.counters
        assert counts["episodes.repeated_report"] == 2 and counts["episodes.duplicate_end"] == 0
        assert (await conn.request(EpisodeDelivered(episode_id=a.episode_id))).ok
        peer = coord.delivering[b.episode_id].peer
        coord.on_peer_dead(peer, ConnectionError("missed heartbeats"))
        coord.on_peer_dead(peer, ConnectionError("missed heartbeats"))  # said twice: still once
        c = await conn.request(WorkRequest(worker="w2"))
        assert (c.group_id, c.sample_index, c.attempt) == (b.group_id, b.sample_index, 0)
        assert coord.counters["episodes.reissued_undelivered"] == 1
        # handed back by the worker and then by the learner (or a retried request): out once
        for undelivered in (True, False):
            rej = EpisodeRejected(
                episode_id=c.episode_id,
                group_id=c.group_id,
                sample_index=c.sample_index,
                task_id=c.task_id,
                undelivered=undelivered,
            )
            if undelivered:
                assert not (await conn.request(rej)).ok  # not ended yet: nothing to hand out
                done = EpisodeEnded(episode_id=c.episode_id, status="completed", score=0.0, worker="w2")
                assert (await conn.request(done)).ok
            assert (await conn.request(rej)).ok
        d = await conn.request(WorkRequest(worker="w2"))
        assert (d.group_id, d.sample_index) == (c.group_id, c.sample_index)
        assert coord.counters["episodes.rejected_again"] == 1
        # the worker of d is taken for dead mid-episode and d retried; its late end is refused
        coord.on_peer_dead(coord.running[d.episode_id].peer, ConnectionError("missed heartbeats"))
        late = EpisodeEnded(episode_id=d.episode_id, status="completed", score=1.0, worker="w2")
        refused = await conn.request(late)
        assert not refused.ok and "already ended retried" in refused.note

    run(_with_coordinator(cfg, _tasks(1), body, mode="train", n_samples=2, batch_size=1, max_staleness=1))


def test_a_learner_restart_retires_a_group_whose_delivered_members_died_with_it():
    """One member of a group reached the learner that died (no checkpoint trained it); the other was handed
    back undelivered and waits in the queue. The group still goes out again whole under a fresh id (the
    delivered member is lost), its queued sample is dropped, and every restart's answer names every group
    retired so far."""
    cfg = fast_config()

    async def body(coord, conn):
        a, b = [await conn.request(WorkRequest(worker="w")) for _ in range(2)]
        for w in (a, b):
            await conn.request(EpisodeEnded(episode_id=w.episode_id, status="completed", worker="w"))
        await conn.request(EpisodeDelivered(episode_id=a.episode_id))
        back = EpisodeRejected(
            episode_id=b.episode_id, group_id=b.group_id, sample_index=1, task_id=b.task_id, undelivered=True
        )
        assert (await conn.request(back)).ok and [t.group_id for t in coord.todo] == [a.group_id]
        retired = await conn.request(LearnerResumed(version=0, trained_groups=[], epoch=1))
        assert retired.groups == [a.group_id] and coord.learner_epoch == 1
        assert sorted((t.group_id, t.sample_index) for t in coord.todo) == [
            (f"{a.group_id}r1", i) for i in (0, 1)
        ]
        again = await conn.request(LearnerResumed(version=0, trained_groups=[], epoch=1))
        assert again.groups == [a.group_id] and len(coord.todo) == 2  # nothing retired twice
        stale = await conn.request(WeightsPublished(version=5, epoch=0))  # the dead learner's
        assert not stale.ok and coord.learner_version == 0

    run(_with_coordinator(cfg, _tasks(1), body, mode="train", n_samples=2, batch_size=1, max_staleness=1))


def test_load_suite_reads_the_local_suite():
    tasks = load_suite(SUITE / "test.json")
    listing = json.loads((SUITE / "test.json").read_text())
    assert {t.domain for t in tasks} == set(listing) and {"terminal", "gimp", "chrome"} <= set(listing)
    assert len(tasks) == sum(map(len, listing.values())) and all(t.task["id"] == t.task_id for t in tasks)
    assert [t.task_id for t in load_suite(SUITE / "test.json", domains=["terminal"], limit=2)] == [
        "terminal-echo-hello",
        "terminal-rename",
    ]


@pytest.mark.parametrize(
    "listing, match",
    [
        ("not json", "not JSON"),
        ("[1, 2]", "object of domain"),
        ('{"terminal": ["../../etc/passwd"]}', "plain file name"),
        ('{"terminal": ["missing-task"]}', "cannot read"),
        ('{"terminal": ["terminal-rename", "terminal-rename"]}', "twice"),
        ('{"..": ["x"]}', "plain file name"),
        ("{}", "no tasks"),
    ],
)
def test_load_suite_rejects_bad_lists(tmp_path, listing, match):
    (tmp_path / "examples").symlink_to(SUITE / "examples")
    meta = tmp_path / "list.json"
    meta.write_text(listing)
    with pytest.raises(SuiteError, match=match) as err:
        load_suite(meta)
    assert isinstance(err.value, InputError)


def test_load_suite_rejects_a_broken_task_file(tmp_path):
    (tmp_path / "examples" / "d").mkdir(parents=True)
    (tmp_path / "examples" / "d" / "x.json").write_text(json.dumps({"id": "x"}))
    (tmp_path / "examples" / "d" / "y.json").write_text(
        json.dumps({"id": "other", "instruction": "i", "evaluator": {"func": "infeasible"}})
    )
    (tmp_path / "a.json").write_text('{"d": ["x"]}')
    with pytest.raises(SuiteError, match="x.json"):
        load_suite(tmp_path / "a.json")
    (tmp_path / "b.json").write_text('{"d": ["y"]}')
    with pytest.raises(SuiteError, match="its id is 'other'"):
        load_suite(tmp_path / "b.json")
    with pytest.raises(SuiteError, match="no domain"):
        load_suite(tmp_path / "b.json", domains=["zzz"])


def test_train_mode_admits_whole_groups_under_the_staleness_bound():
    """AReaL's bound: with batch 2 x 2 samples and max_staleness 1, at most (v + 2) x 4 episodes are ever
    admitted at learner version v; groups stay together; epochs reshuffle the tasks deterministically."""
    cfg = fast_config()

    async def body(coord, conn):
        assigned = []
        while True:
            work = await conn.request(WorkRequest(worker="w"))
            if isinstance(work, NoWork):
                break
            assigned.append(work)
        assert work.reason.startswith("staleness") and len(assigned) == 8  # (0 + 1 + 1) x 2 x 2
        groups: dict[str, list[int]] = {}
        for a in assigned:
            assert a.mode == "train"
            groups.setdefault(a.group_id, []).append(a.sample_index)
        assert all(sorted(v) == [0, 1] for v in groups.values()) and len(groups) == 4
        # the first epoch covers all three tasks before any repeats
        first_epoch = [a.task_id for a in assigned[::2]][:3]
        assert sorted(first_epoch) == ["t0", "t1", "t2"]
        # finishing episodes does not admit more: only a new learner version does
        for a in assigned[:2]:
            await conn.request(EpisodeEnded(episode_id=a.episode_id, status="completed", score=1.0))
        assert isinstance(await conn.request(WorkRequest(worker="w")), NoWork)
        ack = await conn.request(WeightsPublished(version=1))
        assert ack.ok and coord.admission_limit() == 12
        more = [await conn.request(WorkRequest(worker="w")) for _ in range(5)]
        assert [isinstance(m, EpisodeAssignment) for m in more] == [True] * 4 + [False]
        # an environment error is retried inside the same group without admitting more
        retried = more[0]
        await conn.request(EpisodeEnded(episode_id=retried.episode_id, status="retried", env_error="vm died"))
        again = await conn.request(WorkRequest(worker="w"))
        assert (again.group_id, again.sample_index, again.attempt) == (
            retried.group_id,
            retried.sample_index,
            1,
        )
        assert coord.admitted == 12

    run(
        _with_coordinator(
            cfg, _tasks(3), body, mode="train", n_samples=2, batch_size=2, max_staleness=1, seed=7
        )
    )


def test_train_mode_stops_after_max_groups():
    cfg = fast_config()

    async def body(coord, conn):
        work = [await conn.request(WorkRequest(worker="w")) for _ in range(3)]
        assert [type(w).__name__ for w in work] == ["EpisodeAssignment", "EpisodeAssignment", "NoWork"]
        for w in work[:2]:
            await conn.request(EpisodeEnded(episode_id=w.episode_id, status="completed", score=0.0))
        done = await conn.request(WorkRequest(worker="w"))
        assert done.reason == "done" and coord.all_done.is_set()

    run(_with_coordinator(cfg, _tasks(2), body, mode="train", n_samples=2, max_staleness=5, max_groups=1))


def test_a_restarted_learner_gets_the_groups_it_lost(tmp_path):
    """Groups delivered whole to a learner that died before its checkpoint are handed out again, under a
    fresh group id; groups trained, running or queued are not; the state file follows."""

    cfg = fast_config()
    state = tmp_path / "coordinator.json"

    async def body(coord, conn):
        work = [await conn.request(WorkRequest(worker="w")) for _ in range(4)]
        groups = sorted({w.group_id for w in work})
        assert len(groups) == 2
        for w in work:  # both groups delivered (and ended) ...
            await conn.request(EpisodeEnded(episode_id=w.episode_id, status="completed", score=0.0))
        # ... but only the first was trained before the learner died
        retired = await conn.request(LearnerResumed(version=1, trained_groups=[groups[0]]))
        assert isinstance(retired, GroupsRetired) and retired.groups == [groups[1]]  # the learner settles it
        again = [await conn.request(WorkRequest(worker="w")) for _ in range(2)]
        assert {a.group_id for a in again} == {f"{groups[1]}r1"} and sorted(
            a.sample_index for a in again
        ) == [0, 1]
        saved = json.loads(state.read_text())
        assert f"{groups[1]}r1" in saved["admitted_groups"] and groups[1] not in saved["admitted_groups"]
        assert coord.counters["groups.reissued"] == 1

    run(
        _with_coordinator(
            cfg,
            _tasks(3),
            body,
            mode="train",
            n_samples=2,
            batch_size=2,
            max_staleness=1,
            state_path=str(state),
        )
    )


def test_periodic_evaluation_in_train_mode(tmp_path):
    """At every `eval_every` versions, one greedy eval-mode episode per eval task comes before new groups;
    its result goes to eval.jsonl, not into the training results or the staleness bound."""
    cfg = fast_config()
    log = tmp_path / "eval.jsonl"
    evals = [SuiteTask(f"e{i}", "d", {"id": f"e{i}"}) for i in range(2)]

    async def body(coord, conn):
        first = [await conn.request(WorkRequest(worker="w")) for _ in range(2)]  # the first group
        assert all(w.mode == "train" and w.temperature is None for w in first)
        await conn.request(WeightsPublished(version=1))
        ev = [await conn.request(WorkRequest(worker="w")) for _ in range(2)]
        assert [(w.mode, w.temperature, w.task_id) for w in ev] == [("eval", 0.0, "e0"), ("eval", 0.0, "e1")]
        admitted = coord.admitted
        for w, score in zip(ev, (1.0, 0.0), strict=True):
            await conn.request(EpisodeEnded(episode_id=w.episode_id, status="completed", score=score))
        (line,) = [json.loads(x) for x in log.read_text().splitlines()]
        assert line["version"] == 1 and line["accuracy"] == 0.5 and line["tasks"] == 2
        assert coord.admitted == admitted and not any(k[0].startswith("eval@") for k in coord.results)
        assert not coord.evals_pending()
        # the learner restarts from its starting weights and makes a version 1 again: other weights, so
        # they are evaluated too (and the line says which lineage epoch they are of)
        await conn.request(LearnerResumed(version=0, trained_groups=[]))
        await conn.request(WeightsPublished(version=1, epoch=1))
        again = [await conn.request(WorkRequest(worker="w")) for _ in range(2)]
        assert [(w.mode, w.task_id) for w in again] == [("eval", "e0"), ("eval", "e1")]
        assert again[0].group_id == "eval@1e1/e0"
        for w in again:
            await conn.request(EpisodeEnded(episode_id=w.episode_id, status="completed", score=1.0))
        lines = [json.loads(x) for x in log.read_text().splitlines()]
        assert [(x["epoch"], x["version"], x["accuracy"]) for x in lines] == [(0, 1, 0.5), (1, 1, 1.0)]

    run(
        _with_coordinator(
            cfg,
            _tasks(2),
            body,
            mode="train",
            n_samples=2,
            batch_size=1,
            max_staleness=0,
            eval_tasks=evals,
            eval_every=1,
            eval_log=str(log),
        )
    )


# a train run of groups of four samples, one group per update, evaluated at every version
ONE_GROUP_OF_FOUR = {"mode": "train", "n_samples": 4, "batch_size": 1, "max_staleness": 1, "eval_every": 1}


def _summary(coord: Coordinator, run_dir, *, version: int) -> dict:
    """The run's `summary.json` as `guirl train` writes it, for a learner whose last version is `version`."""
    (run_dir / "metrics.jsonl").write_text(json.dumps({"version": version, "time": 0.0}) + "\n")
    return train_summary(coord, coord.snapshot(), run_dir=run_dir, sync=False, ckpt="c", seconds=1.0)[0]


def test_the_end_of_training_drops_queued_samples_so_the_last_evaluation_runs_at_once(tmp_path):
    """Once the learner's last update is made, the training samples still queued (their groups will never be
    trained) are dropped and counted (in the run's summary too), and the evaluation of the last version is
    handed out next."""
    cfg = fast_config()
    evals = [SuiteTask(f"e{i}", "d", {"id": f"e{i}"}) for i in range(2)]

    async def body(coord, conn):
        first = await conn.request(WorkRequest(worker="w"))  # one of the group's four samples
        assert first.mode == "train"
        await conn.request(WeightsPublished(version=1))  # the last version: its evaluation queued after them
        queued = [t for t in coord.todo if t.eval_version < 0]
        assert len(queued) >= 3 and not coord.no_more_groups  # the group's other samples are ahead of it
        assert coord.end_training() == len(queued)  # the driver's call, once the learner has exited
        assert coord.no_more_groups and not [t for t in coord.todo if t.eval_version < 0]
        assert coord.counters["episodes.not_started_by_end"] == len(queued)
        assert coord.end_training() == 0  # nothing left to drop
        summary = _summary(coord, tmp_path, version=1)
        assert summary["episodes_not_started_by_end"] == len(queued)
        ev = [await conn.request(WorkRequest(worker="w")) for _ in range(2)]
        assert [(w.mode, w.task_id) for w in ev] == [("eval", "e0"), ("eval", "e1")]
        assert isinstance(await conn.request(WorkRequest(worker="w")), NoWork)  # nothing else: no new group
        for w in ev:
            await conn.request(EpisodeEnded(episode_id=w.episode_id, status="completed", score=1.0))
        assert not coord.evals_pending() and coord.eval_lines[-1]["accuracy"] == 1.0
        # the training episode in flight still ends (and is reported) as before
        ack = await conn.request(EpisodeEnded(episode_id=first.episode_id, status="completed", score=0.0))
        assert ack.ok

    run(_with_coordinator(cfg, _tasks(2), body, eval_tasks=evals, **ONE_GROUP_OF_FOUR))


def test_once_the_last_version_is_out_training_samples_are_held_until_the_learner_completes(tmp_path):
    """The learner has published its last version (`train.updates`): a worker is handed that version's
    evaluation ahead of the training samples still queued, then told to wait, not "done" (the learner can
    still die before its checkpoint); an episode it could no longer take is not handed out again (quietly:
    the end of a run, not a fault); a learner restarted from an older checkpoint makes handing out resume;
    and its completion drops what is held."""
    cfg = fast_config()
    evals = [SuiteTask("e0", "d", {"id": "e0"})]

    async def body(coord, conn):
        first = await conn.request(WorkRequest(worker="w"))
        assert first.mode == "train" and not coord.updates_made()
        done = EpisodeEnded(episode_id=first.episode_id, status="completed", score=1.0, worker="w")
        assert (await conn.request(done)).ok
        await conn.request(WeightsPublished(version=2))  # the last version
        assert coord.updates_made()
        ev = await conn.request(WorkRequest(worker="w"))
        assert (ev.mode, ev.task_id) == ("eval", "e0")  # ahead of the group's three queued samples
        held = await conn.request(WorkRequest(worker="w"))
        assert isinstance(held, NoWork) and held.reason != "done" and held.retry_after_s > 0
        assert [t.eval_version for t in coord.todo] == [-1, -1, -1]  # held, not dropped
        back = EpisodeRejected(
            episode_id=first.episode_id,
            group_id=first.group_id,
            sample_index=first.sample_index,
            task_id=first.task_id,
            undelivered=True,
        )
        ack = await conn.request(back)
        assert not ack.ok and "last update" in ack.note and len(coord.todo) == 3
        again = await conn.request(back)  # a repeated request: counted once
        assert not again.ok and "taken already" in again.note
        assert (
            coord.counters["episodes.after_last_update"] == 1 and coord.counters["episodes.undelivered"] == 0
        )
        await conn.request(EpisodeEnded(episode_id=ev.episode_id, status="completed", score=1.0, worker="w"))
        # the learner dies before its checkpoint and restarts from version 1 (a new lineage epoch); its
        # LearnerResumed is lost, its first weights say a new epoch began: handing out resumes (and the
        # coordinator's version is not lowered: the admission bound does not shut out the new learner)
        await conn.request(WeightsPublished(version=1, epoch=1))
        assert coord.learner_version == 2 and not coord.updates_made()
        more = await conn.request(WorkRequest(worker="w"))
        assert isinstance(more, EpisodeAssignment) and more.mode == "train"
        await conn.request(WeightsPublished(version=2, epoch=1))  # its last version: held again
        assert coord.updates_made()
        # an environment fault now: the sample is kept (held), in case the learner restarts once more
        cut = EpisodeEnded(episode_id=more.episode_id, status="retried", env_error="x", worker="w")
        assert (await conn.request(cut)).ok
        assert (coord.todo[0].group_id, coord.todo[0].sample_index) == (more.group_id, more.sample_index)
        queued = len([t for t in coord.todo if t.eval_version < 0])
        assert queued == 3 and coord.end_training() == queued and not coord.updates_made()
        # its versions 1 and 2 (after a lost LearnerResumed) are not evaluated again: nothing is left
        assert isinstance(await conn.request(WorkRequest(worker="w")), NoWork)
        summary = _summary(coord, tmp_path, version=2)
        assert (summary["episodes_after_last_update"], summary["episodes_not_started_by_end"]) == (1, 3)
        assert summary["episodes_undelivered"] == 0

    run(_with_coordinator(cfg, _tasks(2), body, eval_tasks=evals, last_version=2, **ONE_GROUP_OF_FOUR))
