"""What the learner tells the coordinator besides its versions: that it (re)started, with the groups its
checkpoint had trained, and which episodes it will not train (so they are handed out again). The
coordinator is the driver's: it is gone only when the run is, so a failure is logged and counted, never
fatal."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

from guirl.messages.types import EpisodeRejected, GroupsRetired, LearnerResumed, Trajectory

log = logging.getLogger(__name__)


class CoordinatorLink:
    """`coord`: the learner's connection to the coordinator (anything with `request(msg, timeout=...)`)."""

    def __init__(self, coord: Any, runtime: Any, counters: Counter) -> None:
        self.coord, self.runtime, self.counters = coord, runtime, counters
        self._rejections: set[asyncio.Task] = set()

    async def resumed(self, version: int, trained_groups: set[str], epoch: int) -> list[str]:
        """Whatever the previous learner received after its checkpoint died with it: the coordinator hands
        those groups out again under fresh ids (a fresh start has nothing admitted: a no-op). Returns the
        groups it retired: a member of one still on its way is never trained."""
        from guirl.runtime.errors import ActorError
        from guirl.runtime.retry import retry_idempotent

        resumed = LearnerResumed(version=version, trained_groups=sorted(trained_groups), epoch=epoch)
        rt = self.runtime
        try:  # asking again is harmless: the answer is every group retired so far
            reply = await retry_idempotent(
                lambda: self.coord.request(resumed, timeout=rt.request_timeout_s),
                attempts=5,
                initial=rt.reconnect_backoff_initial_s,
                cap=rt.reconnect_backoff_max_s,
            )
        except ActorError as exc:
            log.warning("could not tell the coordinator this learner resumed: %s", exc)
            return []
        return list(reply.groups) if isinstance(reply, GroupsRetired) else []

    def rejected(self, traj: Trajectory, why: str) -> None:
        """Have the coordinator hand `traj`'s sample out again (in the background)."""
        msg = EpisodeRejected(
            episode_id=traj.episode_id,
            group_id=traj.group_id,
            sample_index=traj.sample_index,
            task_id=traj.task_id,
            reason=why[:300],
        )
        task = asyncio.create_task(self._tell(msg))
        self._rejections.add(task)
        task.add_done_callback(self._rejections.discard)

    async def _tell(self, msg: EpisodeRejected) -> None:
        from guirl.runtime.errors import ActorError

        try:
            await self.coord.request(msg, timeout=self.runtime.request_timeout_s)
        except ActorError as exc:
            self.counters["rejections.untold"] += 1
            log.warning("could not tell the coordinator to hand %s out again: %s", msg.episode_id, exc)
