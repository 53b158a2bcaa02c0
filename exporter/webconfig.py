"""TLS and basic auth for the exporter's own endpoint: Prometheus' web-config file.

The format is the Prometheus exporter-toolkit's (node_exporter's `--web.config.file`), so
one file serves every exporter of a fleet and `promtool check web-config` checks it:

    tls_server_config:
      cert_file: server.crt          # relative paths: from the file's directory
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: ca.crt
      min_version: TLS12             # default; TLS13 too
    basic_auth_users:
      prometheus: $2b$10$...         # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':')

Keys glassbox does not implement are refused by name, never ignored. `WebConfigSource`
re-reads the file, and the certificate, key and CA files it names, when any of them
changes (checked on each new connection, a few `stat` calls); a change that does not
load is logged and the last good configuration stays in force. Whether TLS is on is
fixed at start, as in the exporter-toolkit.

`BasicAuth` checks credentials in constant time as far as anyone outside can tell: an
unknown user is checked against a dummy hash of the same cost as the real ones, so a
wrong user and a wrong password cost the same bcrypt. A verified password is remembered
(its SHA-256, per user), so a scrape pays bcrypt once, not every time. Hashes and
passwords never appear in a message.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.core import Metric
from vllm_glassbox.core.series import WEB_CONFIG_RELOAD

log = logging.getLogger("glassbox.exporter")

_BCRYPT_HASH = re.compile(r"\$2[aby]?\$(\d\d)\$[./A-Za-z0-9]{53}")
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file"}
_TLS_KEYS |= {"min_version", "max_version"}
_FILE_KEYS = ("cert_file", "key_file", "client_ca_file")


class WebConfigError(ValueError):
    """The web-config file cannot be used; the message names the key (never a secret)."""


@dataclass(frozen=True)
class WebConfig:
    tls: ssl.SSLContext | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    files: tuple[Path, ...] = ()  # every file it was read from, to notice changes


def load_web_config(path: str | Path) -> WebConfig:
    """Read and check a web-config file; WebConfigError says what is wrong."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as e:
        raise WebConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise WebConfigError(f"{path}: not YAML{where}") from None
    if not isinstance(data, dict):
        raise WebConfigError(f"{path}: expected a mapping at the top level")
    _only(data, {"tls_server_config", "basic_auth_users"}, "")
    tls, files = _tls(data.get("tls_server_config"), path.parent)
    return WebConfig(tls, _users(data.get("basic_auth_users")), (path, *files))


def _only(data: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise WebConfigError(
            f"{where}{', '.join(unknown)}: not supported by glassbox "
            f"(supported: {', '.join(sorted(known))})"
        )


def _tls(data: Any, base: Path) -> tuple[ssl.SSLContext | None, list[Path]]:
    if data is None:
        return None, []
    where = "tls_server_config."
    if not isinstance(data, dict):
        raise WebConfigError("tls_server_config: expected a mapping")
    _only(data, _TLS_KEYS, where)
    if not data.get("cert_file") or not data.get("key_file"):
        raise WebConfigError(f"{where}cert_file and {where}key_file are both required")
    files = {k: base / str(data[k]) for k in _FILE_KEYS if data.get(k)}
    auth = data.get("client_auth_type") or "NoClientCert"
    if auth not in _CLIENT_AUTH:
        known = ", ".join(_CLIENT_AUTH)
        raise WebConfigError(f"{where}client_auth_type: {auth!r} not supported ({known})")
    if "client_ca_file" in files and auth == "NoClientCert":
        raise WebConfigError(f"{where}client_ca_file is set, but client_auth_type is NoClientCert")
    if "client_ca_file" not in files and auth != "NoClientCert":
        raise WebConfigError(f"{where}client_auth_type {auth} needs client_ca_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    for key, attribute in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        version = data.get(key, "TLS12" if key == "min_version" else None)
        if version is None:
            continue
        if version not in _TLS_VERSIONS:
            raise WebConfigError(f"{where}{key}: {version!r} not supported (TLS12 or TLS13)")
        setattr(context, attribute, _TLS_VERSIONS[version])
    try:
        # An empty password: an encrypted key fails here instead of prompting on a tty.
        context.load_cert_chain(files["cert_file"], files["key_file"], password=b"")
    except (OSError, ssl.SSLError) as e:
        raise WebConfigError(
            f"{where}cert_file/key_file: cannot load {files['cert_file']} with "
            f"{files['key_file']}: {_reason(e)}"
        ) from None
    if "client_ca_file" in files:
        try:
            context.load_verify_locations(cafile=files["client_ca_file"])
        except (OSError, ssl.SSLError) as e:
            raise WebConfigError(
                f"{where}client_ca_file: cannot load {files['client_ca_file']}: {_reason(e)}"
            ) from None
        context.verify_mode = _CLIENT_AUTH[auth]
    return context, list(files.values())


def _reason(error: OSError | ssl.SSLError) -> str:
    if isinstance(error, ssl.SSLError):
        return str(error.reason or "not a valid PEM file")
    return str(error.strerror or error)


def _users(data: Any) -> dict[str, bytes]:
    if data is None:
        return {}
    if not isinstance(data, dict) or not data:
        raise WebConfigError("basic_auth_users: expected a mapping of user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in data.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"basic_auth_users: {user!r} is not a valid user name")
        if not isinstance(hashed, str) or not _BCRYPT_HASH.fullmatch(hashed):
            raise WebConfigError(f"basic_auth_users.{user}: not a bcrypt hash ($2b$NN$…)")
        users[user] = hashed.encode()
    try:
        import bcrypt  # noqa: F401  (only needed with users)
    except ImportError:
        raise WebConfigError("basic_auth_users needs the bcrypt package") from None
    return users


def _signature(files: tuple[Path, ...]) -> tuple[tuple[int, int, int] | None, ...]:
    """What changes when any file is rewritten, replaced or rotated by a symlink swap."""

    def one(path: Path) -> tuple[int, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    return tuple(one(p) for p in files)


class WebConfigSource:
    """The current web configuration, re-read when one of its files changes."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._config = load_web_config(self.path)  # a bad file at start is a flag error
        self._signature = _signature(self._config.files)
        self._auth = BasicAuth(self._config.users)
        self._lock = threading.Lock()
        self.last_reload_ok = True

    @property
    def tls(self) -> bool:
        return self._config.tls is not None

    def current(self) -> tuple[ssl.SSLContext | None, BasicAuth]:
        """The TLS context and authenticator to use for a new connection."""
        with self._lock:
            signature = _signature(self._config.files)
            if signature != self._signature:
                self._signature = signature
                self._reload()
            return self._config.tls, self._auth

    def _reload(self) -> None:
        try:
            config = load_web_config(self.path)
            if (config.tls is None) != (self._config.tls is None):
                raise WebConfigError("turning TLS on or off needs a restart")
        except WebConfigError as e:
            self.last_reload_ok = False
            log.error("web config not reloaded, the previous one stays in force: %s", e)
            return
        self._config = config
        self._signature = _signature(config.files)
        self.last_reload_ok = True
        if config.users != self._auth.users:
            self._auth = BasicAuth(config.users)
        log.info("web config reloaded path=%s", self.path)

    def collect(self) -> Iterator[Metric]:
        """`glassbox_web_config_last_reload_successful`: 0 while a broken change waits."""
        yield WEB_CONFIG_RELOAD.single(1.0 if self.last_reload_ok else 0.0)

    def describe(self) -> list[Metric]:
        return []


class BasicAuth:
    """Checks `Authorization: Basic …` against bcrypt hashes; see the module docstring."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self.users = dict(users)
        self._verified: dict[str, tuple[bytes, bytes]] = {}  # user -> (hash, SHA-256)
        self._bcrypt_lock = threading.Lock()  # one bcrypt at a time: a flood of guesses
        self._dummy: bytes | None = None  # cannot take every core; made on first need

    @property
    def required(self) -> bool:
        return bool(self.users)

    def cached(self, user: str, password: bytes) -> bool:
        """Already verified (cheap, no bcrypt): the common case of a scrape."""
        remembered = self._verified.get(user)
        stored = self.users.get(user)
        return (
            remembered is not None
            and remembered[0] == stored
            and hmac.compare_digest(remembered[1], _digest(user, password))
        )

    def check(self, user: str, password: bytes) -> bool:
        """Whether `user` and `password` match; costs one bcrypt unless cached."""
        if self.cached(user, password):
            return True
        if not self.users:
            return False
        import bcrypt

        stored = self.users.get(user)
        with self._bcrypt_lock:
            if stored is None and self._dummy is None:
                self._dummy = _dummy_hash(self.users)
            against = stored if stored is not None else self._dummy
            assert against is not None
            # bcrypt reads at most 72 bytes of a password (htpasswd's hashes too).
            ok = bcrypt.checkpw(password[:72], against)
        if ok and stored is not None:
            self._verified[user] = (stored, _digest(user, password))
            return True
        return False


def _digest(user: str, password: bytes) -> bytes:
    return hashlib.sha256(user.encode() + b"\0" + password).digest()


def _dummy_hash(users: dict[str, bytes]) -> bytes:
    """A hash of the same cost as the real ones (the highest), matching no password."""
    import bcrypt

    cost = max(int(_BCRYPT_HASH.fullmatch(h.decode()).group(1)) for h in users.values())  # type: ignore[union-attr]
    return bytes(bcrypt.hashpw(os.urandom(16), bcrypt.gensalt(rounds=cost)))
