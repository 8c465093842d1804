"""CURVE encryption and ZAP authentication for actor sockets (`runtime.curve_keys_dir`).

A cluster's key directory, made by `guirl keys init DIR`:

    DIR/                      mode 0700
      cluster.key             the cluster's public key (ZeroMQ certificate format, `zmq.auth`)
      cluster.key_secret      its secret key, mode 0600: the identity every guirl process of the cluster uses
      authorized/             public keys allowed to connect to a mailbox (`*.key`); holds cluster.key

With a key directory configured, every mailbox ROUTER is a CURVE server and every connection DEALER a CURVE
client of the cluster key. The server checks each client's public key against `authorized/` through ZAP
(RFC 27), answered by a small handler on the actor's own context and event loop (a ROUTER bound at
`inproc://zeromq.zap.01`, read in callback style like every other guirl socket, so it runs under uvloop
with no thread). `ZAP_ENFORCE_DOMAIN` makes libzmq refuse clients outright if that handler is missing,
rather than accept them all (libzmq's default without a handler).

Refusals are counted in the actor's counters (and so in its `StatsReply`):
  - `security.refused`: a client completed the CURVE handshake with a key not in `authorized/`;
  - `security.handshake_failed`: a peer could not complete a CURVE handshake at all (a plain-text
    socket, a client holding a wrong server key, garbage, a connection dropped mid-handshake).
A refused client keeps reconnecting, so one peer counts once per attempt; the log gets one warning per
refused address per `REFUSED_LOG_INTERVAL_S`.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

from guirl.runtime.errors import FatalError
from guirl.runtime.sockets import AsyncSocket
from guirl.runtime.stats import Counters

log = logging.getLogger(__name__)

CLUSTER_KEY = "cluster"
"""Base name of the cluster's certificate files (`cluster.key`, `cluster.key_secret`)."""
AUTHORIZED = "authorized"
"""Subdirectory of the public keys allowed to connect."""
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
"""Where libzmq sends a context's ZAP requests (RFC 27)."""
ZAP_DOMAIN = b"guirl"
REFUSED_LOG_INTERVAL_S = 60.0
"""A refused address is logged at most once in this many seconds."""
MAX_LOGGED_ADDRESSES = 4096
"""Addresses remembered for log rate limiting (a scan of many addresses must not grow memory)."""

_HANDSHAKE_FAILURES = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
_Z85_CHARS = frozenset(z85.Z85CHARS)


class KeysError(FatalError):
    """A key directory that cannot be created or used (missing, unreadable, malformed, too open)."""


@dataclass(frozen=True)
class ClusterKeys:
    """A loaded key directory: the cluster's keypair (Z85) and the authorized client keys (raw bytes)."""

    path: Path
    public: bytes
    secret: bytes
    authorized: frozenset[bytes]


# -- key directories ---------------------------------------------------------------------------------


def init_keys(path: str | os.PathLike, *, force: bool = False) -> ClusterKeys:
    """Create a key directory at `path` (see the module docstring) and return its keys.

    Refuses a `path` that holds anything unless `force`, which replaces the whole directory (keys added to
    `authorized/` included). The new directory is built beside `path` and renamed into place, so a failure
    midway leaves no half-made key directory."""
    path = Path(path).absolute()
    try:
        if path.exists() and not path.is_dir():
            raise KeysError(f"{path} exists and is not a directory")
        if path.is_dir() and any(path.iterdir()) and not force:
            raise KeysError(f"{path} already exists and is not empty; use --force to replace it (new keys)")
        path.parent.mkdir(parents=True, exist_ok=True)
        _replace_with_new_keys(path)
    except OSError as exc:
        raise KeysError(f"cannot create the key directory {path}: {exc}") from None
    return load_keys(path)


def _replace_with_new_keys(path: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))  # mode 0700
    try:
        public_file, secret_file = zmq.auth.create_certificates(tmp, CLUSTER_KEY)
        os.chmod(secret_file, 0o600)
        os.chmod(public_file, 0o644)
        (tmp / AUTHORIZED).mkdir()
        os.chmod(tmp / AUTHORIZED, 0o700)
        shutil.copyfile(public_file, tmp / AUTHORIZED / f"{CLUSTER_KEY}.key")
        os.chmod(tmp / AUTHORIZED / f"{CLUSTER_KEY}.key", 0o644)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
            os.rename(path, old / "keys")
            try:
                os.rename(tmp, path)
            except OSError:
                os.rename(old / "keys", path)  # put the previous keys back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _z85_key(value: bytes | None, what: str, file: Path) -> bytes:
    """`value` checked to be a Z85-encoded 32-byte CURVE key."""
    if not value:
        raise KeysError(f"{file}: no {what} found")
    if len(value) != 40 or not set(value) <= _Z85_CHARS:
        raise KeysError(f"{file}: the {what} is not a 40-character Z85 CURVE key")
    return value


def _load_certificate(file: Path, *, secret: bool) -> tuple[bytes, bytes | None]:
    if not file.is_file():
        raise KeysError(f"{file} is missing; create the key directory with `guirl keys init DIR`")
    try:
        public, secret_key = zmq.auth.load_certificate(file)
    except (OSError, ValueError, IndexError) as exc:
        raise KeysError(f"{file} is not a readable ZeroMQ certificate: {exc}") from None
    public = _z85_key(public, "public key", file)
    if secret:
        secret_key = _z85_key(secret_key, "secret key", file)
        if zmq.curve_public(secret_key) != public:
            raise KeysError(f"{file}: the secret key does not belong to the public key beside it")
    return public, secret_key


def load_keys(path: str | os.PathLike) -> ClusterKeys:
    """Load and check a key directory; every problem is a `KeysError` that names the file."""
    path = Path(path).absolute()
    if not path.is_dir():
        raise KeysError(f"CURVE key directory {path} does not exist; create it with `guirl keys init {path}`")
    secret_file = path / f"{CLUSTER_KEY}.key_secret"
    try:
        mode = secret_file.stat().st_mode
    except OSError as exc:
        raise KeysError(f"{secret_file} is missing or unreadable: {exc.strerror}") from None
    if mode & 0o077:  # as ssh does: a secret others can read is no secret
        raise KeysError(
            f"{secret_file} is readable by other users (mode {stat.filemode(mode)}); chmod 600 it"
        )
    public, secret = _load_certificate(secret_file, secret=True)
    cluster_public, _ = _load_certificate(path / f"{CLUSTER_KEY}.key", secret=False)
    if cluster_public != public:
        raise KeysError(f"{path / (CLUSTER_KEY + '.key')} does not match {secret_file}")
    authorized_dir = path / AUTHORIZED
    if not authorized_dir.is_dir():
        raise KeysError(f"{authorized_dir} is missing: no client could be authorized")
    try:
        files = sorted(authorized_dir.glob("*.key"))
    except OSError as exc:
        raise KeysError(f"{authorized_dir} is unreadable: {exc.strerror}") from None
    authorized = set()
    for file in files:
        key, _ = _load_certificate(file, secret=False)
        authorized.add(z85.decode(key))
    if not authorized:
        raise KeysError(f"{authorized_dir} holds no public keys (*.key): no client could be authorized")
    return ClusterKeys(path=path, public=public, secret=secret, authorized=frozenset(authorized))


# -- sockets -----------------------------------------------------------------------------------------


def curve_client(sock: zmq.Socket, keys: ClusterKeys) -> None:
    """Make `sock` (not yet connected) a CURVE client with the cluster's identity, expecting a server
    that holds the cluster key."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


class CurveSecurity:
    """CURVE on one actor's sockets: the keys, and the ZAP handler and handshake monitors on its context.

    Create inside the running loop; `close()` after the sockets it secured are closed, before the context
    is terminated."""

    def __init__(
        self,
        keys: ClusterKeys,
        ctx: zmq.Context,
        counters: Counters,
        on_error: Callable[[BaseException], None],
    ) -> None:
        self.keys = keys
        self.ctx = ctx
        self.counters = counters
        self.on_error = on_error
        self._zap: AsyncSocket | None = None
        self._monitors: list[AsyncSocket] = []
        self._logged_at: dict[str, float] = {}  # refused address -> when last logged
        self._handshake_logged_at = 0.0

    def secure_server(self, sock: zmq.Socket, name: str = "mailbox") -> None:
        """Make `sock` (not yet bound) a CURVE server whose clients ZAP authenticates."""
        if self._zap is None:
            self._start_zap()
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no ZAP handler answering = nobody gets in
        monitor = sock.get_monitor_socket(_HANDSHAKE_FAILURES)
        monitor.setsockopt(zmq.LINGER, 0)
        self._monitors.append(AsyncSocket(monitor, self._on_monitor_event, self.on_error, f"{name}-monitor"))

    def secure_client(self, sock: zmq.Socket) -> None:
        """Make `sock` (not yet connected) a CURVE client with the cluster's identity."""
        curve_client(sock, self.keys)

    def close(self) -> None:
        for monitor in self._monitors:
            monitor.close()
        self._monitors.clear()
        if self._zap is not None:
            self._zap.close()
            self._zap = None

    # -- ZAP ------------------------------------------------------------------------------------------

    def _start_zap(self) -> None:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise FatalError(f"cannot start the ZAP handler: {exc}") from None
        self._zap = AsyncSocket(sock, self._on_zap_request, self.on_error, "zap")

    def _on_zap_request(self, frames: list) -> None:
        """[route, b"", version, request id, domain, address, identity, mechanism, *credentials]"""
        parts = [f.bytes for f in frames]
        if len(parts) < 8 or parts[1] != b"" or parts[2] != b"1.0":
            self.counters["security.zap_malformed"] += 1
            return  # libzmq never sends this; nothing sensible to answer
        route, request_id, address, mechanism, credentials = parts[0], parts[3], parts[5], parts[7], parts[8:]
        client_key = credentials[0] if mechanism == b"CURVE" and credentials else b""
        if client_key in self.keys.authorized:
            self.counters["security.accepted"] += 1
            reply = [b"200", b"OK", z85.encode(client_key)]
        else:
            self.counters["security.refused"] += 1
            self._log_refused(address.decode("utf-8", "replace"), mechanism, client_key)
            reply = [b"400", b"client key not authorized", b""]
        self._zap.try_send([route, b"", b"1.0", request_id, *reply, b""])

    def _log_refused(self, address: str, mechanism: bytes, client_key: bytes) -> None:
        now = time.monotonic()
        last = self._logged_at.get(address)
        if last is not None and now - last < REFUSED_LOG_INTERVAL_S:
            return
        if len(self._logged_at) >= MAX_LOGGED_ADDRESSES:
            self._logged_at.clear()
        self._logged_at[address] = now
        key = z85.encode(client_key).decode() if len(client_key) == 32 else "none"
        log.warning(
            "refused a %s peer at %s: its public key %s is not in %s (%d refused so far; "
            "this address is not logged again for %.0f s)",
            mechanism.decode("ascii", "replace"),
            address or "?",
            key,
            self.keys.path / AUTHORIZED,
            self.counters["security.refused"],
            REFUSED_LOG_INTERVAL_S,
        )

    # -- handshake failures -----------------------------------------------------------------------------

    def _on_monitor_event(self, frames: list) -> None:
        """[event (uint16) + value (uint32), endpoint]: a peer failed the CURVE handshake."""
        if not frames or len(frames[0]) < 6:
            return
        event, value = struct.unpack_from("=HI", frames[0].buffer)
        if not event & _HANDSHAKE_FAILURES:
            return
        self.counters["security.handshake_failed"] += 1
        now = time.monotonic()
        if now - self._handshake_logged_at >= REFUSED_LOG_INTERVAL_S:
            self._handshake_logged_at = now
            endpoint = frames[1].bytes.decode("utf-8", "replace") if len(frames) > 1 else "?"
            log.warning(
                "a peer of %s failed the CURVE handshake (event %d, error %d): a plain-text socket or one "
                "without the cluster's server key (%d so far; not logged again for %.0f s)",
                endpoint,
                event,
                value,
                self.counters["security.handshake_failed"],
                REFUSED_LOG_INTERVAL_S,
            )
