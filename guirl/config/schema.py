"""The configuration schema: every section and field, with a one-line docstring each.

To add a setting: add a field (with its docstring) to a section, and, if OpenClaw-RL's GUI-RL scripts set
it through the environment, add the variable to ``ENV_VARS`` (and to ``SECRET_KEYS`` if secret).
"""

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

PosFloat = Annotated[float, Meta(gt=0)]
PosInt = Annotated[int, Meta(gt=0)]
NonNegInt = Annotated[int, Meta(ge=0)]
NonNegFloat = Annotated[float, Meta(ge=0)]


def _redacted_repr(self: msgspec.Struct, secrets: tuple[str, ...]) -> str:
    """A config section's repr with its secrets shown as `***` (a logged or printed section leaks nothing)."""
    parts = []
    for name in self.__struct_fields__:
        value = getattr(self, name)
        parts.append(f"{name}={REDACTED!r}" if name in secrets and value else f"{name}={value!r}")
    return f"{type(self).__name__}({', '.join(parts)})"


class RunConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Identity and location of one run."""

    name: str = "guirl"
    """Run name; the prefix of the run directory."""
    root_dir: str = "runs"
    """Directory under which run directories are created."""
    seed: NonNegInt = 0
    """Base random seed; each actor derives its own from it."""


Endpoint = Annotated[str, Meta(pattern=r"^(tcp://[^\s]+:(\d+|\*)|ipc://[^\s]+)$")]


class EndpointsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where each actor's mailbox binds: `tcp://HOST:PORT` (port 0 = a random free port) or `ipc://PATH`."""

    coordinator: Endpoint = "tcp://127.0.0.1:0"
    """Mailbox of the coordinator (workers pull episodes from it)."""
    broker: Endpoint = "tcp://127.0.0.1:0"
    """Mailbox of the inference broker (workers send policy requests to it)."""
    prm: Endpoint = "tcp://127.0.0.1:0"
    """Mailbox of the PRM judge actor."""
    learner: Endpoint = "tcp://127.0.0.1:0"
    """Mailbox of the learner (trajectories go to it)."""


class RoleTimeouts(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A progress deadline per actor role, in seconds; 0 = `runtime.progress_timeout_s`."""

    coordinator: NonNegFloat = 0.0
    """The coordinator's."""
    broker: NonNegFloat = 0.0
    """The inference broker's (it loads models and weights in its own process)."""
    learner: NonNegFloat = 0.0
    """The learner's (it announces checkpoint saves and weight gathers as busy besides)."""
    prm: NonNegFloat = 0.0
    """The PRM actor's."""
    env_worker: NonNegFloat = 0.0
    """Each env worker's."""
    dataset_worker: NonNegFloat = 0.0
    """Each dataset worker's (GUI-R1 mode)."""


class RuntimeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Actor runtime: heartbeats, reconnection, queues and shutdown."""

    heartbeat_interval_s: PosFloat = 1.0
    """Seconds between heartbeats sent to each peer (both the actors' own and ZeroMQ's transport ones)."""
    heartbeat_liveness: PosInt = 3
    """The transport deadline, in heartbeat intervals: a peer whose connection is lost (its process killed
    or stopped, its host cut off) and that has said nothing for this long is declared dead. ZeroMQ's own
    I/O threads keep a busy peer's connection alive, so a busy peer is never dead by this rule."""
    liveness: Literal["transport", "heartbeats"] = "transport"
    """`transport`: dead, hung or busy as above. `heartbeats`: the rule before it (a peer whose own
    heartbeats stop for the transport deadline is dead, busy or not), kept for `bench/liveness.py`."""
    progress_timeout_s: PosFloat = 120.0
    """A peer whose connection is alive but that has sent nothing (its event loop starved or hung) for this
    long is declared hung, and handled as dead. Each actor announces its own (`progress_timeout_by_role`)."""
    progress_timeout_by_role: RoleTimeouts = msgspec.field(default_factory=RoleTimeouts)
    """Per role: the progress deadline an actor of that role announces instead of `progress_timeout_s`."""
    busy_timeout_s: PosFloat = 900.0
    """The progress deadline an actor announces while it does known heavy work (a checkpoint save, a weight
    gather or load): its peers wait for it this long, and its requests wait with them."""
    reconnect_backoff_initial_s: PosFloat = 0.1
    """First delay before reconnecting to a lost peer, in seconds."""
    reconnect_backoff_max_s: PosFloat = 5.0
    """Cap on the exponential reconnect delay, in seconds."""
    request_timeout_s: PosFloat = 30.0
    """Seconds a remote request may take before it fails."""
    sndhwm: NonNegInt = 1000
    """ZeroMQ send high-water mark per socket, in messages (0 = unlimited)."""
    rcvhwm: NonNegInt = 1000
    """ZeroMQ receive high-water mark per socket, in messages (0 = unlimited)."""
    inbox_max: PosInt = 1024
    """Bound of each actor's inbound message queue."""
    inbox_max_bytes: PosInt = 2**30
    """Bound on the bytes (frames) of the messages queued in an actor's inbox."""
    max_concurrency: PosInt = 64
    """Most handler tasks an actor runs at once."""
    shutdown_timeout_s: PosFloat = 5.0
    """Seconds an actor has on shutdown to drain the requests in flight, and again to settle the work other
    actors already count as done (an env worker's end reports)."""
    term_timeout_s: PosFloat = 2.0
    """Seconds to wait for the ZeroMQ context to terminate."""
    fault_injection: bool = False
    """Honour `HoldGil` messages (an actor holds the GIL for a given time, as a Python-heavy save would):
    for tests and benchmarks of liveness; refused otherwise."""
    curve_keys_dir: str = ""
    """CURVE key directory (`guirl keys init DIR`): set, every mailbox is a CURVE server admitting only the
    public keys in DIR/authorized/ (ZAP) and every connection a CURVE client; empty = no encryption."""


class CodecConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Limits checked when decoding wire messages."""

    max_frames: PosInt = 1024
    """Most frames accepted in one multipart message. A train run's trajectory is one message of up to
    `2 + 4 x agent.max_steps` frames (per step its prompt ids, response ids, log-probs and screen: a history
    image is an earlier step's screen, sent once); `guirl train` refuses a limit below that."""
    max_frame_bytes: PosInt = 64 * 2**20
    """Largest accepted single frame, in bytes."""
    max_body_bytes: PosInt = 8 * 2**20
    """Largest accepted message body (excluding blob frames), in bytes."""
    max_depth: PosInt = 32
    """Deepest nesting accepted in a decoded message body."""


class RecorderConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Optional recording of wire messages for replay and debugging."""

    enabled: bool = False
    """Record messages to disk."""
    directions: list[Literal["in", "out"]] = msgspec.field(default_factory=lambda: ["in", "out"])
    """Which directions to record: inbound, outbound or both."""
    sockets: list[str] = msgspec.field(default_factory=list)
    """Which sockets to record: `mailbox` and/or connection names (e.g. `broker`); empty records all."""
    dir: str = ""
    """Directory for message logs; empty means <run_dir>/msglogs."""
    rotate_bytes: PosInt = 256 * 2**20
    """Size at which a message log file is rotated, in bytes."""


class LoggingConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Process log output."""

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Lowest level of log lines emitted."""
    format: Literal["text", "json"] = "text"
    """Log line format: human-readable text or one JSON object per line."""


class SupervisorConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Restart policy for actor processes."""

    restart_backoff_initial_s: PosFloat = 0.5
    """First delay before restarting a crashed actor, in seconds."""
    restart_backoff_max_s: PosFloat = 30.0
    """Cap on the exponential restart delay, in seconds."""
    max_restarts: NonNegInt = 5
    """Restarts allowed within restart_window_s before the run fails."""
    restart_window_s: PosFloat = 300.0
    """Sliding window over which restarts are counted, in seconds."""
    start_timeout_s: PosFloat = 600.0
    """Seconds an actor process has to report ready (a broker loads its model first)."""
    stop_timeout_s: PosFloat = 10.0
    """Seconds an actor process has to exit before it is killed."""


class ClusterConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GPU layout of the cluster."""

    num_gpus: PosInt = 8
    """Total GPUs available to the run."""
    actor_gpus: NonNegInt = 4
    """GPUs used by the training actor (learner); 0 in an evaluation-only layout (all GPUs serve)."""
    rollout_gpus: PosInt = 4
    """GPUs used by rollout inference engines."""
    prm_gpus: NonNegInt = 0
    """GPUs used by the process reward model (0 = no PRM)."""
    learner_cpus: list[NonNegInt] = []
    """CPU cores the learner's ranks are pinned to (empty = no pinning): on a CPU-only machine, the
    analogue of giving the learner its own GPUs."""
    rollout_cpus: list[NonNegInt] = []
    """CPU cores the rollout side is pinned to — the broker's engines, the env workers and their desktops
    (empty = no pinning)."""


class ModelConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Model checkpoints."""

    hf_ckpt: str = ""
    """Path of the Hugging Face checkpoint of the policy."""
    prm_model_path: str = ""
    """Path of the process reward model; empty means none."""


class RolloutConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Rollout batch shape."""

    batch_size: PosInt = 8
    """Prompts (tasks) per rollout batch."""
    n_samples_per_prompt: PosInt = 8
    """Episodes sampled per prompt (the group size for advantages)."""


class ReplayConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Replayed desktops (`env.provider = "replay"`): a recorded run's screens, at almost no cost."""

    run: str = ""
    """The recorded run directory whose episodes the desktops replay (its `episodes/`)."""
    step_latency_s: Annotated[float, Meta(ge=0, le=600)] = 0.0
    """Seconds a replayed desktop takes to act and show the next screen (a real VM's step time)."""
    step_jitter: Annotated[float, Meta(ge=0, le=1)] = 0.0
    """Each step's time drawn uniformly within this fraction of `step_latency_s` either side (real desktops
    do not step in lockstep)."""
    tolerance_px: Annotated[int, Meta(ge=0, le=10000)] = 8
    """How far (pixels) an action's point may be from the recorded one and still count as the recorded
    action: an episode that took the recorded actions gets the recorded score, any other is not scored."""


class EnvConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GUI environment pool and desktop settings."""

    max_envs: PosInt = 64
    """Most environments (VMs or desktops) alive at once."""
    workers: PosInt = 1
    """Env worker processes (`--workers`), in every mode; a cluster file sets them per host instead."""
    vms_per_worker: NonNegInt = 0
    """VMs each env worker owns (episodes it runs at once); 0 = `env.max_envs` shared out over the workers."""
    prewarm_envs: NonNegInt = 64
    """Environments created ahead of demand at startup."""
    provider: Literal["local", "replay", "aws", "volcengine", "aliyun"] = "local"
    """VM provider that hosts the desktops (`replay`: a recorded run's screens, `[env.replay]`)."""
    region: str = "cn-beijing"
    """Cloud region in which VMs are created."""
    action_space: Literal["pyautogui", "computer_use"] = "pyautogui"
    """Action space the agent emits."""
    observation_type: Literal["screenshot", "a11y_tree", "screenshot_a11y_tree"] = "screenshot"
    """What the agent observes each step."""
    screen_width: PosInt = 1920
    """Desktop width, in pixels."""
    screen_height: PosInt = 1080
    """Desktop height, in pixels."""
    screenshot_cursor: bool = True
    """Draw the mouse pointer into local desktops' screenshots, as OSWorld's VM server draws it into its own
    (a policy trained on one sees the other alike); off: the screen alone. Cloud VMs run OSWorld's server."""
    accessibility: bool = True
    """Run AT-SPI on local desktops, as OSWorld's image does: the accessibility tree (`/accessibility`, its
    getters and metrics) and GNOME Terminal's text; off: those answer 501, their tasks are refused (or
    skipped), and applications run without their accessibility bridges. Cloud VMs run OSWorld's image."""
    step_latency_s: Annotated[float, Meta(ge=0, le=60)] = 0.0
    """Extra seconds every step costs, parsed or not (benchmarks: a cloud VM is slower than a local one)."""
    chromium_port: Annotated[int, Meta(ge=0, le=65535)] = 9222
    """Port of Chrome's DevTools on a VM (OSWorld's tasks expose it on 9222), for Chrome tasks' steps and
    getters; 0 = none. A cloud VM's is reached at its address, a local desktop's through its server."""
    chrome_profile_dir: str = "~/.config/google-chrome"
    """Chrome's user-data directory on the VM (OSWorld's images: Google Chrome's)."""
    google_drive_settings: str = ""
    """PyDrive's settings.yml (OAuth client and refresh token) for the tasks with Google Drive steps or files
    (OSWorld's evaluation_examples/settings/googledrive/); empty: those tasks are unsupported."""
    google_account: str = ""
    """A JSON file `{"email", "password"}` for tasks that log in to Google; empty: they are unsupported."""
    replay: ReplayConfig = msgspec.field(default_factory=ReplayConfig)
    """Replayed desktops (`provider = "replay"`)."""


class WandbConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Weights & Biases logging (`guirl.tracking`)."""

    key: str = ""
    """W&B API key (WANDB_KEY, guirl's older name); empty = W&B's own: WANDB_API_KEY, or `wandb login`'s
    netrc. Never written to the run directory or sent in the run's config."""
    project: str = "guirl"
    """W&B project name."""
    mode: Literal["auto", "online", "offline", "disabled", "dryrun", "run"] = "auto"
    """`auto` = online when a key is found, else disabled; `offline` = files in <run_dir>/wandb, no key, no
    network; W&B's own WANDB_MODE values mean what they mean to W&B (`dryrun` = offline, `run` = online)."""
    entity: str = ""
    """W&B entity (user or team) that owns the runs; empty = the key's default entity."""
    name: str = ""
    """W&B run name; empty = the run directory's name."""
    tags: list[str] = msgspec.field(default_factory=list)
    """Tags attached to each W&B run."""

    def __repr__(self) -> str:
        return _redacted_repr(self, ("key",))


class AWSConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """AWS EC2 desktops (boto3). Credentials come from boto3's usual chain (AWS_ACCESS_KEY_ID, profiles,
    instance roles), never from this file; the region is `env.region`."""

    image_id: str = ""
    """AMI of the desktop image (OSWorld's, or your own with the VM server on `cloud.vm_port`)."""
    instance_type: str = "t3.xlarge"
    """EC2 instance type."""
    subnet_id: str = ""
    """Private subnet the instances go in (no public address is asked for)."""
    security_group_id: str = ""
    """Security group of the instances: it may open `cloud.vm_port` to `cloud.cluster_cidr` only."""
    root_snapshot_id: str = ""
    """Snapshot the root volume is replaced from on reset (empty: the AMI's own snapshot)."""
    endpoint_url: str = ""
    """EC2 endpoint override (a test's loopback server); empty = AWS's."""


class VolcengineConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Volcengine ECS desktops (volcengine-python-sdk); the region is `env.region`."""

    access_key: str = ""
    """Volcengine access key id (VOLC_ACCESSKEY)."""
    secret_key: str = ""
    """Volcengine secret access key (VOLC_SECRETKEY)."""
    image_id: str = ""
    """ECS image from which desktop VMs are created (VOLCENGINE_IMAGE_ID)."""
    subnet_id: str = ""
    """Subnet in which desktop VMs are created (VOLCENGINE_SUBNET_ID)."""
    security_group_id: str = ""
    """Security group of the instances (VOLCENGINE_SECURITY_GROUP_ID)."""
    instance_type: str = "ecs.g3il.xlarge"
    """ECS instance type (VOLCENGINE_INSTANCE_TYPE)."""
    zone_id: str = ""
    """Availability zone (empty: the subnet's)."""
    host: str = ""
    """API host override (`127.0.0.1:PORT` for a test's stand-in; empty = open.volcengineapi.com)."""
    scheme: Literal["https", "http"] = "https"
    """API scheme (http only for a loopback stand-in)."""

    def __repr__(self) -> str:
        return _redacted_repr(self, ("access_key", "secret_key"))


class AliyunConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Alibaba Cloud ECS desktops (alibabacloud_ecs20140526); the region is `env.region`."""

    access_key_id: str = ""
    """AccessKey id (ALIBABA_CLOUD_ACCESS_KEY_ID)."""
    access_key_secret: str = ""
    """AccessKey secret (ALIBABA_CLOUD_ACCESS_KEY_SECRET)."""
    image_id: str = ""
    """ECS image of the desktop."""
    vswitch_id: str = ""
    """VSwitch (subnet) of the instances."""
    security_group_id: str = ""
    """Security group of the instances."""
    instance_type: str = "ecs.g7.xlarge"
    """ECS instance type."""
    endpoint: str = ""
    """API endpoint override (`127.0.0.1:PORT` for a test's stand-in; empty = ecs.<region>.aliyuncs.com)."""
    protocol: Literal["https", "http"] = "https"
    """API protocol (http only for a loopback stand-in)."""

    def __repr__(self) -> str:
        return _redacted_repr(self, ("access_key_id", "access_key_secret"))


class CloudConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Cloud desktops: the lifecycle every provider shares, and each cloud's own settings."""

    vm_port: Annotated[int, Meta(ge=1, le=65535)] = 5000
    """Port of the VM server on each instance (OSWorld's: 5000)."""
    cluster_cidr: str = ""
    """Address range of the cluster (e.g. `10.0.0.0/16`): the only one that may reach `vm_port`. Required for
    a cloud provider; `0.0.0.0/0` (or any public range) is refused."""
    ttl_s: PosFloat = 86400.0
    """Seconds an instance may live: tagged `guirl:ttl`, and a shutdown timer in its user data powers it
    off then (a SIGKILLed cluster cannot leak instances past it); the reaper terminates it after."""
    reset: Literal["replace_root", "relaunch"] = "replace_root"
    """How a VM is reset: its root volume replaced from the image (keeps the instance and its address), or
    terminate-and-relaunch (where a cloud cannot replace the root volume)."""
    launch_rate_per_s: PosFloat = 2.0
    """Most launch calls per second to the cloud (a token bucket, `launch_burst` deep)."""
    launch_burst: PosInt = 4
    """Launches that may go at once before the rate applies."""
    launch_concurrency: PosInt = 8
    """Instances being launched (and waited for) at once."""
    ready_timeout_s: PosFloat = 900.0
    """Seconds a new or reset instance has to run and answer on `vm_port`."""
    api_attempts: PosInt = 8
    """Attempts of one cloud call throttled or failed in passing (jittered exponential backoff)."""
    heartbeat_s: PosFloat = 30.0
    """Seconds between the run's heartbeats (the reaper takes a run silent for 5 of them as dead)."""
    aws: AWSConfig = msgspec.field(default_factory=AWSConfig)
    """AWS settings."""
    volcengine: VolcengineConfig = msgspec.field(default_factory=VolcengineConfig)
    """Volcengine settings."""
    aliyun: AliyunConfig = msgspec.field(default_factory=AliyunConfig)
    """Alibaba Cloud settings."""


class DemoConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The transport demo."""

    workers: PosInt = 3
    """Env workers in the transport demo."""
    steps: PosInt = 10
    """Steps per demo episode."""
    episodes: PosInt = 4
    """Episodes per worker."""
    step_latency_s: Annotated[float, Meta(ge=0)] = 0.05
    """Simulated inference time per step at the stand-in broker, in seconds."""
    kill_one: bool = True
    """SIGKILL the broker midway to show failure detection, supervision and reconnection."""
    desktops: bool = True
    """Also bring up two local VMs and play two shipped tasks with their reference solutions."""


class AgentConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The policy's prompt and action parsing (Qwen3-VL computer use)."""

    coordinates: Literal["relative", "absolute"] = "relative"
    """Coordinates the model speaks: a 0-999 grid over the screen (`relative`) or pixels of the image seen."""
    history_images: NonNegInt = 2
    """Past steps shown with their screenshots (the current one comes on top); older ones are text only."""
    max_prompt_tokens: PosInt = 32768
    """Token budget of one prompt; the oldest history images are dropped first to fit."""
    image_factor: PosInt = 32
    """Side multiple images are resized to (patch size x merge size of the vision encoder)."""
    min_pixels: PosInt = 3136
    """Fewest pixels of an image after `smart_resize`."""
    max_pixels: PosInt = 16 * 16 * 4 * 12800
    """Most pixels of an image after `smart_resize` (GUI-RL's bound: a 1080p screen stays 1920x1088)."""
    max_steps: PosInt = 15
    """Steps before an episode is cut off (TRUNCATED, then evaluated as it stands)."""
    max_actions_per_step: PosInt = 5
    """Most tool calls executed from one response (the rest are ignored and counted)."""
    temperature: Annotated[float, Meta(ge=0)] = 1.0
    """Sampling temperature of the policy (0 = greedy)."""
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    """Nucleus sampling mass."""
    max_new_tokens: PosInt = 512
    """Most tokens in one response."""
    gui_r1_actions: Literal["high", "low"] = "high"
    """With `response_format = "gui_r1"`: the action space the prompt offers, GUI-R1's full one (`high`), or
    its click-only one (`low`: a shorter prompt, for tasks that are clicks)."""
    response_format: Literal["computer_use", "gui_r1"] = "computer_use"
    """How the policy is asked and read on a desktop: Qwen3-VL's computer-use tool calls, or GUI-R1's
    `<think>`/`<answer>` format (one screenshot, text history; a policy trained in GUI-R1 mode)."""
    sleep_after_action_s: Annotated[float, Meta(ge=0, le=60)] = 0.0
    """Pause after each action before the next screenshot (applications need time to redraw)."""
    prompt_style: Literal["guirl", "gui-rl"] = "guirl"
    """The prompt's text: guirl's, or GUI-RL's system turn and history byte for byte (its checkpoints)."""


class HFBackendConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The transformers backend."""

    device: str = "cpu"
    """Torch device of each engine (`cpu`, `cuda`, `cuda:1`, ...)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype."""
    threads: NonNegInt = 0
    """Torch intra-op threads per engine (0 = torch's default)."""


class SGLangBackendConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """SGLang servers (the production backend on GPUs): launched per engine, or attached to by URL."""

    urls: list[str] = msgspec.field(default_factory=list)
    """Attach to these running servers (`http://host:port`, one engine each) instead of launching any."""
    tp_size: PosInt = 1
    """Tensor-parallel GPUs per launched server: the rollout GPUs make `rollout_gpus / tp_size` engines."""
    host: str = "127.0.0.1"
    """Interface a launched server listens on."""
    port: Annotated[int, Meta(ge=0, le=65535)] = 0
    """Port of the first launched server (the next ones count up); 0 = free ports."""
    mem_fraction_static: Annotated[float, Meta(gt=0, le=1)] = 0.8
    """Fraction of each GPU's memory SGLang takes for weights and KV cache (`--mem-fraction-static`)."""
    context_length: NonNegInt = 0
    """Most tokens of prompt + response (`--context-length`; 0 = the model's own)."""
    server_command: list[str] = msgspec.field(default_factory=list)
    """The launch command before SGLang's flags (empty = `python -m sglang.launch_server`)."""
    extra_args: list[str] = msgspec.field(default_factory=list)
    """More `launch_server` flags, passed as given (e.g. `["--attention-backend", "fa3"]`)."""
    start_timeout_s: PosFloat = 1200.0
    """Seconds a launched server has to load its model and answer `/health_generate`."""
    max_concurrency: PosInt = 64
    """Requests in flight to one server at once (SGLang batches them continuously)."""
    weight_load_format: Literal["flattened_bucket", "per_tensor"] = "flattened_bucket"
    """How a weight update travels: one collective per bucket (SGLang's `flattened_bucket`), or one per
    tensor (older SGLang releases)."""
    deterministic: bool = False
    """Launch with `--enable-deterministic-inference`, so each request's sampling seed is honoured (SGLang
    ignores seeds otherwise; it then needs a deterministic attention backend: fa3, flashinfer or triton)."""


class OpenAIBackendConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """An OpenAI-compatible chat completions endpoint (evaluation only: it returns no token ids)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    """Base URL of the endpoint (…/v1)."""
    model: str = ""
    """Model name sent with each request (empty = the checkpoint path)."""
    api_key: str = ""
    """Bearer token, if the endpoint needs one."""
    timeout_s: PosFloat = 300.0
    """Seconds one completion may take."""
    max_concurrency: PosInt = 16
    """Requests in flight to the endpoint at once."""

    def __repr__(self) -> str:
        return _redacted_repr(self, ("api_key",))


class ScriptedBackendConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The scripted backend: answers with given responses (tests, debugging, replays)."""

    dir: str = "tasks/local/solutions"
    """Directory of `<task_id>.jsonl` scripts: typed actions, or `{"response": "..."}` lines."""
    latency_s: Annotated[float, Meta(ge=0)] = 0.0
    """Simulated generation time per batch, in seconds."""
    latency_jitter: Annotated[float, Meta(ge=0, le=1)] = 0.0
    """Each batch's time drawn uniformly within this fraction of `latency_s` either side (a latency model:
    a real engine's time varies, so requests do not stay in lockstep)."""
    tokens: bool = False
    """Answer with token ids and log-probs, as a model's engine does, so a `guirl train` with a simulated
    learner (`train.simulated_update_s`) can run on scripts: the response's UTF-8 bytes as its ids, each with
    log-prob 0; the prompt's text as bytes and each image as Qwen3-VL's count of its tokens."""


class InferenceConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The inference broker and its engines."""

    backend: Literal["hf", "openai", "scripted", "sglang"] = "hf"
    """Engine backend behind the broker."""
    engines: PosInt = 1
    """Engine instances the broker routes over."""
    max_batch: PosInt = 8
    """Most requests in one engine batch (1 = batching off)."""
    max_wait_ms: Annotated[float, Meta(ge=0)] = 20.0
    """How long a partial batch waits for more requests, in milliseconds."""
    max_queue: PosInt = 256
    """Requests queued at the broker before new ones are refused as overloaded (backpressure)."""
    max_attempts: PosInt = 3
    """Engines a request is tried on before it fails (a dead engine's batch is retried elsewhere)."""
    health_interval_s: PosFloat = 5.0
    """Seconds between engine health checks."""
    request_timeout_s: PosFloat = 600.0
    """Seconds an env worker waits for one policy response."""
    dispatch: Literal["auto", "batch", "stream"] = "auto"
    """How requests reach engines: `auto` streams them to engines that batch continuously (sglang, openai:
    each request sent alone, up to the engine's `max_concurrency` at once, no batch barrier) and forms static
    batches for the others (hf, scripted); `batch` forms static batches for every engine, one in flight each;
    `stream` streams to every engine (a static one takes up to its `max_batch` at once). For every model the
    broker serves (the PRM's judge too)."""
    hf: HFBackendConfig = msgspec.field(default_factory=HFBackendConfig)
    """Transformers backend settings."""
    openai: OpenAIBackendConfig = msgspec.field(default_factory=OpenAIBackendConfig)
    """OpenAI-compatible backend settings."""
    scripted: ScriptedBackendConfig = msgspec.field(default_factory=ScriptedBackendConfig)
    """Scripted backend settings."""
    sglang: SGLangBackendConfig = msgspec.field(default_factory=SGLangBackendConfig)
    """SGLang backend settings."""


class ScriptedJudgeConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The scripted judge: known verdicts without a model (tests, benchmarks)."""

    latency_s: Annotated[float, Meta(ge=0)] = 0.0
    """Seconds each judge call takes (a judge that takes a fixed time per call)."""
    invalid_every: NonNegInt = 0
    """Every n-th step (by a stable hash) gets an answer without a score (0 = never)."""


class PRMConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The process reward model: a judge VLM that scores every step as it streams (PRM+RL mode)."""

    enabled: bool = False
    """Judge every training step (the judge's checkpoint is `model.prm_model_path`)."""
    backend: Literal["hf", "openai", "scripted", "sglang"] = "hf"
    """Engine backend of the judge, behind the broker under its own model name."""
    model_name: str = "judge"
    """The judge's model name at the broker."""
    engines: PosInt = 1
    """Judge engine instances."""
    max_batch: PosInt = 8
    """Most judge requests in one engine batch."""
    votes: PosInt = 1
    """Votes per step (m), each sampled with its own seed; the step's score is the mean of the valid ones."""
    temperature: Annotated[float, Meta(ge=0, le=100)] = 0.6
    """Sampling temperature of the judge (votes with distinct seeds need it above 0)."""
    max_new_tokens: PosInt = 4096
    """Most tokens of one judge answer (it reasons before its boxed score)."""
    template: str = "guirl-prm-v1"
    """The judge prompt: a built-in name, or a TOML file with `system` and `user` (guirl/prm/prompt.py)."""
    history_images: Annotated[int, Meta(ge=0, le=16)] = 0
    """Earlier screenshots shown to the judge besides the current and the next one (at most 16)."""
    max_pixels: PosInt = 16 * 16 * 4 * 12800
    """Most pixels of one judge image after `smart_resize` (the policy's default bound)."""
    max_concurrency: PosInt = 32
    """Transitions judged at once (each sends `votes` requests)."""
    max_queue: PosInt = 1024
    """Transitions queued at the PRM before new ones are refused (the workers keep them meanwhile)."""
    worker_queue: PosInt = 256
    """Transitions an env worker holds for the PRM while it is away or full; beyond, a step goes unjudged."""
    score_timeout_s: PosFloat = 300.0
    """Seconds the learner waits, after an episode's trajectory arrives, for its steps' scores; steps still
    without one are marked missing (never invented) and train on the outcome alone."""
    request_timeout_s: PosFloat = 240.0
    """Seconds one judge request may take (a vote that times out is an error, not asked again); keep it below
    `score_timeout_s`, or a slow vote can only make a late score."""
    hf: HFBackendConfig = msgspec.field(default_factory=HFBackendConfig)
    """Transformers backend settings of the judge."""
    openai: OpenAIBackendConfig = msgspec.field(default_factory=OpenAIBackendConfig)
    """OpenAI-compatible endpoint of the judge."""
    scripted: ScriptedJudgeConfig = msgspec.field(default_factory=ScriptedJudgeConfig)
    """Scripted judge settings."""
    sglang: SGLangBackendConfig = msgspec.field(default_factory=SGLangBackendConfig)
    """SGLang servers of the judge (on the PRM's GPUs)."""


class DataConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GUI-R1 mode: single-step grounding rows instead of desktops, scored by a rule reward."""

    train: str = ""
    """Rows to train on (`.jsonl` or `.parquet`, GUI-R1's row format); set, `guirl train` runs GUI-R1 mode."""
    eval: str = ""
    """Held-out rows to evaluate on; set, `guirl eval` (and `train.eval_every`) scores the policy on them."""
    limit: NonNegInt = 0
    """Use only the first N rows of each file (0 = all)."""
    task_type: Literal["row", "high", "low"] = "row"
    """Action space the prompt offers: each row's own (`task_type` column), or all rows `high` / `low`."""
    format_weight: Annotated[float, Meta(ge=0)] = 0.2
    """Weight of the format reward (GUI-R1's public code: 0.2)."""
    accuracy_weight: Annotated[float, Meta(ge=0)] = 0.8
    """Weight of the accuracy reward (GUI-R1's public code: 0.8)."""
    point_radius_px: PosFloat = 140.0
    """A click within this many pixels (of the image shown) of a ground-truth point counts as correct."""
    text_f1: Annotated[float, Meta(ge=0, le=1)] = 0.5
    """Token F1 a text action's text needs against the ground truth to count as correct."""


class SFTConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Supervised fine-tuning (`guirl sft`) on grounding rows with their ground-truth answers."""

    data: str = ""
    """Rows to train on (`.jsonl` or `.parquet`); a row's target is GUI-R1's answer for its ground truth."""
    epochs: PosInt = 1
    """Passes over the rows."""
    batch_size: PosInt = 16
    """Rows per optimizer step."""
    lr: PosFloat = 1e-5
    """AdamW learning rate."""
    limit: NonNegInt = 0
    """Use only the first N rows (0 = all)."""
    think: str = ""
    """Text of the `<think>` part of each target answer (empty: `<think></think>`)."""
    run_dirs: list[str] = msgspec.field(default_factory=list)
    """Behaviour cloning: run directories (eval or train) whose successful episodes' steps are trained on,
    each step's prompt rebuilt from its `traj.jsonl` and screenshots, its response as the policy gave it."""
    min_score: Annotated[float, Meta(ge=0, le=1)] = 1.0
    """Evaluator score an episode needs to be cloned."""
    ranks: PosInt = 1
    """Data-parallel processes (FSDP2), as the learner's `train.ranks`."""


class EvalConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Evaluation-only mode (`guirl eval`)."""

    tasks: str = "tasks/local/test.json"
    """Meta list of the tasks to run: `{domain: [task ids]}` (OSWorld's format)."""
    examples_dir: str = ""
    """Directory of `<domain>/<id>.json` task files; empty = `examples/` beside the meta list."""
    domains: list[str] = msgspec.field(default_factory=list)
    """Only these domains of the meta list (empty = all)."""
    limit: NonNegInt = 0
    """Run only the first N tasks (0 = all)."""
    max_attempts: PosInt = 3
    """Attempts of a task before an environment fault aborts it (environment errors retry elsewhere)."""
    setup_timeout_s: PosFloat = 300.0
    """Seconds the setup steps of one task may take."""
    progress_interval_s: PosFloat = 1.0
    """Seconds between progress lines."""
    skip_unsupported: bool = False
    """Leave out, listed as skipped, the tasks that need a setup step, getter or metric guirl lacks (off:
    such a suite is refused before any VM starts)."""


class TrainConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """RL mode (`guirl train`): the learner and the schedule."""

    tasks: str = "tasks/local/train.json"
    """Meta list of the training tasks (`{domain: [task ids]}`)."""
    domains: list[str] = msgspec.field(default_factory=list)
    """Only these domains of the training meta list (empty = all)."""
    limit: NonNegInt = 0
    """Train only on the first N tasks (0 = all)."""
    skip_unsupported: bool = False
    """Leave out, listed as skipped, the training tasks guirl cannot set up or score (off: refused)."""
    updates: NonNegInt = 0
    """Policy updates to run (0 = until stopped)."""
    lr: PosFloat = 1e-6
    """Adam learning rate."""
    weight_decay: Annotated[float, Meta(ge=0)] = 0.0
    """AdamW weight decay."""
    grad_clip: PosFloat = 1.0
    """Gradient norm clip."""
    eps_clip: PosFloat = 0.2
    """Lower clip of the policy ratio (1 - eps_clip)."""
    eps_clip_high: PosFloat = 0.28
    """Upper clip of the policy ratio (1 + eps_clip_high; DAPO's clip-higher)."""
    tis_cap: Annotated[float, Meta(ge=0)] = 2.0
    """Cap on the truncated importance weight behaviour -> proximal policy (0 = no correction)."""
    loss_agg: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"] = "token-mean"
    """How token losses are averaged."""
    kl_coef: Annotated[float, Meta(ge=0)] = 0.0
    """Coefficient of the KL penalty to the frozen reference (0 = none, as GUI-RL's GRPO)."""
    kl_kind: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator."""
    max_staleness: NonNegInt = 1
    """Policy versions a sample may lag the learner (AReaL's bound; 0 = on-policy)."""
    group_timeout_s: PosFloat = 600.0
    """Seconds a GRPO group waits for members lost to environment errors."""
    partial_groups: Literal["train", "drop"] = "train"
    """What a group that timed out does: train on the members it has (two or more), or drop them."""
    filter_degenerate: bool = False
    """Skip groups whose rewards are all equal (their advantage is zero anyway)."""
    micro_batch_tokens: PosInt = 16384
    """Token budget of one micro-batch (prompt + response tokens)."""
    checkpoint_every: NonNegInt = 10
    """Updates between checkpoints (0 = only at the end)."""
    eval_every: NonNegInt = 0
    """Updates between evaluations on `eval.tasks` (0 = none)."""
    weight_sync: Literal["broadcast", "disk"] = "broadcast"
    """How engines get new weights: a process-group broadcast, or a checkpoint they reload."""
    weight_bucket_mb: PosInt = 512
    """Size of one bucket of a weight broadcast, in MiB (the engines receive bucket by bucket)."""
    weight_join_timeout_s: Annotated[float, Meta(gt=0, le=7 * 86400)] = 30.0
    """Seconds an engine waits to form the weight group with the learner, apart from the transfer (whose
    collectives wait up to `runtime.request_timeout_s`, 120 s at most). An update whose learner is declared
    dead is abandoned at once anyway; this bounds a group that never forms for another reason."""
    weight_backend: Literal["auto", "nccl", "gloo"] = "auto"
    """Backend of the learner -> engines weight group; `auto`: NCCL when the learner is on GPUs, else gloo."""
    weight_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype the weights travel (and load) in; `auto` = bfloat16 to sglang engines, the hf engines' dtype."""
    overlap_publish: bool = True
    """Broadcast the new weights while the next update trains (off: the learner waits for the engines)."""
    device: Literal["", "cpu", "cuda"] = ""
    """Where the learner trains: `cuda` (NCCL, one GPU per rank), `cpu` (gloo), or '' (a GPU when there is
    one)."""
    mixed_precision: Literal["auto", "bf16", "fp32"] = "auto"
    """FSDP2 compute dtype: bf16 with fp32 master weights and fp32 gradient reduction, or fp32; `auto` =
    bf16 on GPUs, fp32 on CPU."""
    activation_checkpointing: Literal["auto", "on", "off"] = "auto"
    """Recompute each decoder layer and vision block in backward; `auto` = on GPUs only."""
    attn_implementation: Literal["auto", "flash_attention_2", "sdpa", "eager"] = "auto"
    """The model's attention kernel; `auto` = flash_attention_2 on GPUs when flash-attn is installed, else
    sdpa."""
    sync: bool = False
    """Run rollout and training in turns (no overlap), for comparison with the decoupled default."""
    advantage: Literal["grpo", "step_wise"] = "grpo"
    """Advantage estimator: `grpo` (episode outcome, z-scored in the group) or `step_wise` (PRM mode: per
    step, outcome + prm_step_coef x PRM score, z-scored over the group's steps of the same index)."""
    prm_step_coef: Annotated[float, Meta(ge=0)] = 1.0
    """Weight of the PRM score in a step's score (`step_wise`)."""
    shuffle_rewards: bool = False
    """A control for learning benchmarks: permute the rewards across a batch's trajectories before the
    advantages (the update then carries no information about which answer was right)."""
    log_advantages: bool = False
    """Write each trained step's reward, PRM score and advantage to <run_dir>/advantages.jsonl."""
    threads: NonNegInt = 0
    """CPU threads of each learner rank's torch ops (0 = torch's default, one per core); on a small CPU
    machine shared with the engines and desktops, fewer threads contend less."""
    ranks: PosInt = 1
    """Data-parallel learner processes (FSDP2 over gloo on CPU, NCCL on GPUs: one per learner GPU). The
    learner actor is rank 0 and starts the others."""
    simulated_update_s: Annotated[float, Meta(ge=0)] = 0.0
    """A learner without a model, for measuring the control plane (0 = off, a real learner): trajectories are
    received, checked, buffered and given advantages as always, but each update only takes this many
    seconds, and each version is published with no weights. Needs the scripted backend with
    `inference.scripted.tokens` (`bench/control_plane.py`, `bench/decoupling.py`)."""


class FaultsConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Single faults injected at a chosen moment, for tests (a seeded schedule of many: `[chaos]`)."""

    kill_vm_at_step: int = -1
    """Kill the VM of the first episode of an eval run at this step (-1 = off)."""
    kill_prm_at_version: NonNegInt = 0
    """SIGKILL the PRM actor once the learner reaches this version (0 = off)."""
    kill_learner_at_version: NonNegInt = 0
    """SIGKILL the learner once the engines serve this version (0 = off); it restarts from its latest
    checkpoint, or from the starting weights when it has none."""


class ChaosConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Fault injection into a local train or eval run (tests and `bench/chaos.py`; see `guirl.chaos`)."""

    seed: NonNegInt = 0
    """Inject `faults` faults drawn from this seed (0 = off): SIGKILL or SIGSTOP/SIGCONT of the broker, the
    learner, env workers, the PRM, and desktops, at random times (after the first update of a train run,
    the first episode of an eval run) and at chosen moments (mid-broadcast, mid-checkpoint, mid-setup,
    mid-evaluation, mid-judging), with a hostile peer sending malformed messages to every actor. Every
    fault goes to `chaos.jsonl`."""
    faults: NonNegInt = 6
    """How many faults a seed draws."""
    span_s: PosFloat = 60.0
    """Seconds over which the faults are spread."""
    busy: NonNegInt = 0
    """Besides `faults`: how many times the broker, the learner or the PRM is made to hold the GIL for 2 to
    4 transport deadlines (a `HoldGil`, as a Python-heavy save does; needs `runtime.fault_injection`). A
    busy actor must never be taken for a dead one: no episode may be lost to it."""


class GuirlConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The whole configuration of a guirl run; each actor receives only its own section."""

    run: RunConfig = msgspec.field(default_factory=RunConfig)
    """Run identity and directory."""
    runtime: RuntimeConfig = msgspec.field(default_factory=RuntimeConfig)
    """Actor runtime settings."""
    endpoints: EndpointsConfig = msgspec.field(default_factory=EndpointsConfig)
    """Mailbox endpoints of the actors."""
    codec: CodecConfig = msgspec.field(default_factory=CodecConfig)
    """Wire codec limits."""
    recorder: RecorderConfig = msgspec.field(default_factory=RecorderConfig)
    """Message recorder."""
    logging: LoggingConfig = msgspec.field(default_factory=LoggingConfig)
    """Logging output."""
    supervisor: SupervisorConfig = msgspec.field(default_factory=SupervisorConfig)
    """Actor supervision and restarts."""
    cluster: ClusterConfig = msgspec.field(default_factory=ClusterConfig)
    """GPU layout."""
    model: ModelConfig = msgspec.field(default_factory=ModelConfig)
    """Model checkpoints."""
    rollout: RolloutConfig = msgspec.field(default_factory=RolloutConfig)
    """Rollout batch shape."""
    env: EnvConfig = msgspec.field(default_factory=EnvConfig)
    """GUI environments."""
    wandb: WandbConfig = msgspec.field(default_factory=WandbConfig)
    """Weights & Biases."""
    cloud: CloudConfig = msgspec.field(default_factory=CloudConfig)
    """Cloud providers."""
    demo: DemoConfig = msgspec.field(default_factory=DemoConfig)
    """Transport demo."""
    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    """Policy prompt and action parsing."""
    inference: InferenceConfig = msgspec.field(default_factory=InferenceConfig)
    """Inference broker and engines."""
    eval: EvalConfig = msgspec.field(default_factory=EvalConfig)
    """Evaluation-only mode."""
    train: TrainConfig = msgspec.field(default_factory=TrainConfig)
    """RL mode."""
    prm: PRMConfig = msgspec.field(default_factory=PRMConfig)
    """Process reward model (PRM+RL mode)."""
    data: DataConfig = msgspec.field(default_factory=DataConfig)
    """Grounding rows (GUI-R1 mode)."""
    sft: SFTConfig = msgspec.field(default_factory=SFTConfig)
    """Supervised fine-tuning."""
    chaos: ChaosConfig = msgspec.field(default_factory=ChaosConfig)
    """Fault injection (tests and soaks)."""
    faults: FaultsConfig = msgspec.field(default_factory=FaultsConfig)
    """Single faults injected at a chosen moment (tests)."""


# OpenClaw-RL's GUI-RL scripts' environment variables, by name -> dotted config path.
ENV_VARS: dict[str, str] = {
    "GUI_RESULT_DIR": "run.root_dir",
    "NUM_GPUS": "cluster.num_gpus",
    "ACTOR_GPUS": "cluster.actor_gpus",
    "ROLLOUT_GPUS": "cluster.rollout_gpus",
    "PRM_GPUS": "cluster.prm_gpus",
    "HF_CKPT": "model.hf_ckpt",
    "PRM_MODEL_PATH": "model.prm_model_path",
    "PRM_M": "prm.votes",
    "PRM_STEP_COEF": "train.prm_step_coef",
    "PRM_TEMPERATURE": "prm.temperature",
    "PRM_MAX_NEW_TOKENS": "prm.max_new_tokens",
    "ROLLOUT_BATCH_SIZE": "rollout.batch_size",
    "N_SAMPLES_PER_PROMPT": "rollout.n_samples_per_prompt",
    "GUI_POOL_MAX_ENVS": "env.max_envs",
    "GUI_PREWARM_ENVS": "env.prewarm_envs",
    "GUI_PROVIDER_NAME": "env.provider",
    "GUI_REGION": "env.region",
    "GUI_ACTION_SPACE": "env.action_space",
    "GUI_OBSERVATION_TYPE": "env.observation_type",
    "GUI_SCREEN_WIDTH": "env.screen_width",
    "GUI_SCREEN_HEIGHT": "env.screen_height",
    "GUI_MAX_STEPS": "agent.max_steps",
    "GUI_HISTORY_IMAGES": "agent.history_images",
    "GUI_COORDINATES": "agent.coordinates",
    "GUI_TEMPERATURE": "agent.temperature",
    "GUI_EVAL_TASKS": "eval.tasks",
    "GUI_INFERENCE_BACKEND": "inference.backend",
    "OPENAI_BASE_URL": "inference.openai.base_url",
    "OPENAI_API_KEY": "inference.openai.api_key",
    "GUI_TRAIN_TASKS": "train.tasks",
    "LR": "train.lr",
    "MAX_STALENESS": "train.max_staleness",
    "WANDB_KEY": "wandb.key",
    "WANDB_PROJECT": "wandb.project",
    "WANDB_MODE": "wandb.mode",
    "WANDB_ENTITY": "wandb.entity",
    "VOLC_ACCESSKEY": "cloud.volcengine.access_key",
    "VOLC_SECRETKEY": "cloud.volcengine.secret_key",
    "VOLCENGINE_IMAGE_ID": "cloud.volcengine.image_id",
    "VOLCENGINE_SUBNET_ID": "cloud.volcengine.subnet_id",
    "VOLCENGINE_SECURITY_GROUP_ID": "cloud.volcengine.security_group_id",
    "VOLCENGINE_INSTANCE_TYPE": "cloud.volcengine.instance_type",
    "ALIBABA_CLOUD_ACCESS_KEY_ID": "cloud.aliyun.access_key_id",
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "cloud.aliyun.access_key_secret",
    "GUI_CLUSTER_CIDR": "cloud.cluster_cidr",
}

# Dotted paths never written out in clear (saved configs, logs).
SECRET_KEYS: frozenset[str] = frozenset(
    {
        "wandb.key",
        "inference.openai.api_key",
        "cloud.volcengine.access_key",
        "cloud.volcengine.secret_key",
        "cloud.aliyun.access_key_id",
        "cloud.aliyun.access_key_secret",
    }
)

REDACTED = "***"
