"""One tagged union per channel. Every channel accepts the control messages.

A mailbox decodes its inbound bodies with its channel's union, so a message of another channel is an
`unknown_type` error at the boundary rather than a surprise in a handler.
"""

from __future__ import annotations

from guirl.messages.types import (
    Ack,
    Echo,
    EchoReply,
    EpisodeAssignment,
    EpisodeDelivered,
    EpisodeEnded,
    EpisodeRejected,
    ErrorReply,
    GroupsRetired,
    Heartbeat,
    HoldGil,
    LearnerResumed,
    NoWork,
    PolicyRequest,
    PolicyResponse,
    Register,
    Shutdown,
    StatsReply,
    StatsRequest,
    StepScore,
    Trajectory,
    Transition,
    WeightsPublished,
    WorkRequest,
)

Control = Heartbeat | Shutdown | ErrorReply | StatsRequest | StatsReply | HoldGil
DiagChannel = Control | Echo | EchoReply
CoordinatorChannel = (
    Control
    | Register
    | Ack
    | WorkRequest
    | EpisodeAssignment
    | NoWork
    | EpisodeEnded
    | WeightsPublished
    | LearnerResumed
    | GroupsRetired
    | EpisodeRejected
    | EpisodeDelivered
)
PolicyChannel = Control | Ack | PolicyRequest | PolicyResponse | WeightsPublished
PRMChannel = Control | Ack | Transition | StepScore
LearnerChannel = Control | Trajectory | StepScore | Ack | WeightsPublished

ANY = (
    Control
    | Echo
    | EchoReply
    | Register
    | Ack
    | WorkRequest
    | EpisodeAssignment
    | NoWork
    | EpisodeEnded
    | PolicyRequest
    | PolicyResponse
    | Transition
    | StepScore
    | Trajectory
    | WeightsPublished
    | LearnerResumed
    | GroupsRetired
    | EpisodeRejected
    | EpisodeDelivered
)
"""Every message type: for tools (replay, inspection) that must read any channel."""

CHANNELS = {
    "diag": DiagChannel,
    "coordinator": CoordinatorChannel,
    "policy": PolicyChannel,
    "prm": PRMChannel,
    "learner": LearnerChannel,
    "any": ANY,
}
"""Channel names as used in configuration."""
