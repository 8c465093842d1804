"""The dataset worker: GUI-R1 mode's environment, where an episode is one step of a grounding row.

It is an env worker (same coordinator protocol, same broker requests, same trajectories to the learner) whose
"VM" is a row: the row's screenshot, resized as the policy's images are, with GUI-R1's prompt (the
instruction, the history of earlier actions, the action space of the row's task type); the policy answers
once (`<think>…</think><answer>[{'action': …, 'point': [x, y], 'input_text': …}]</answer>`), and the rule
reward scores the answer against the row's ground truth (format and accuracy, weights from `[data]`). The
episode's score is its accuracy (1 = the right action, at the right place, with the right text); its reward
for training is the weighted total, with the components beside it for metrics.

Rows come from `data.train` and `data.eval`, loaded once at start; the coordinator hands out row ids as task
ids (`guirl.data.tasks`). A row the worker does not have is an environment error, never a policy failure.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec

from guirl.actors.env_worker import EnvFault, EnvWorker, EnvWorkerOptions, _Episode, _messages_json
from guirl.config.schema import DataConfig
from guirl.data.tasks import task_id_of


class DatasetWorkerOptions(EnvWorkerOptions, kw_only=True, frozen=True, forbid_unknown_fields=True):
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    """The grounding rows and the rule reward's weights (`[data]`)."""


class DatasetWorker(EnvWorker):
    """See the module docstring."""

    role = "dataset_worker"
    Options = DatasetWorkerOptions

    def __init__(self, name: str, options: DatasetWorkerOptions, **runtime: Any) -> None:
        super().__init__(name, options, **runtime)
        from guirl.learner.rule_reward import RewardWeights

        self.data = options.data
        self.weights = RewardWeights(
            format=self.data.format_weight,
            accuracy=self.data.accuracy_weight,
            point_radius_px=self.data.point_radius_px,
            text_f1=self.data.text_f1,
        )
        self.rows: dict[str, Any] = {}

    async def setup(self) -> None:
        from guirl.messages import CoordinatorChannel, LearnerChannel, PolicyChannel

        self.coord = self.connect("coordinator", self.coordinator_ep, CoordinatorChannel)
        self.broker = self.connect("broker", self.broker_ep, PolicyChannel)
        self.learner = self.connect("learner", self.learner_ep, LearnerChannel) if self.learner_ep else None
        self.prm = None
        self.rows = await asyncio.to_thread(self._load)

    def _load(self) -> dict[str, Any]:
        from guirl.data.rows import load_rows
        from guirl.data.source import resolve_rows

        rows: dict[str, Any] = {}
        for split, path in (("train", self.data.train), ("eval", self.data.eval)):
            if path:
                for row in load_rows(resolve_rows(path), limit=self.data.limit):
                    rows[task_id_of(row.id, split)] = row
        return rows

    async def teardown(self) -> None:
        """No VMs to release."""

    async def _run(self, episode: _Episode) -> None:
        from guirl.data.prompt import ground_truth, row_prompt
        from guirl.learner.rule_reward import rule_reward

        ep = episode.ep
        row = self.rows.get(ep.task_id)
        if row is None:
            raise EnvFault(f"no row for task {ep.task_id!r} in this worker's data")
        # decoding and resizing the screenshot is CPU work: off the loop that serves the other slots
        prompt = await asyncio.to_thread(row_prompt, row, self.prompt_cfg, self.data.task_type)
        width, height = prompt.size
        png = prompt.images[0]
        (episode.dir / "step_000.png").write_bytes(png)
        response = await self._ask(ep, 0, prompt)
        episode.versions.add(response.policy_version)
        episode.steps = 1
        truth = ground_truth(row, (width, height))
        reward = rule_reward(response.text, truth, self.weights)
        parts = {"format": reward.format, "type": reward.type, "accuracy": reward.accuracy}
        if reward.point is not None:
            parts["point"] = reward.point
        if reward.text is not None:
            parts["text"] = reward.text
        episode.score = reward.accuracy  # success: the right action, place and text
        episode.reward, episode.reward_parts = reward.total, parts
        episode.outcome = "done" if reward.format else "parse_error"
        if ep.mode == "train":
            episode.add_sample(0, prompt, response, "")
        record = {
            "step": 0,
            "screenshot": "step_000.png",
            "prompt": _messages_json(prompt.messages),
            "prompt_images": [[width, height]],
            "response": response.text,
            "finish_reason": response.finish_reason,
            "policy_version": response.policy_version,
            "policy_epoch": response.policy_epoch,
            "engine": response.engine,
            "row": row.id,
            "ground_truth": {
                "action": truth.action,
                "bbox": list(truth.bbox),
                "input_text": truth.input_text,
            },
            "reward": reward.total,
            "reward_parts": parts,
        }
        (episode.dir / "traj.jsonl").write_text(json.dumps(record) + "\n")
