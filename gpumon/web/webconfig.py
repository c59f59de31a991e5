"""Reading and validating ``--web-config``: the file format of Prometheus' exporter-toolkit.

Operators already write this file for node_exporter and Prometheus itself (``tls_server_config``,
``http_server_config``, ``basic_auth_users`` with bcrypt hashes, ``rate_limit``), so gpumon reads it as is.
Every mistake is a ConfigError naming the file and the key; what gpumon cannot honour (a client SAN allow
list, curve preferences, RequireAnyClientCert) is refused rather than silently ignored, because each is a
restriction the operator expects to hold.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from gpumon.config.settings import ConfigError
from gpumon.files import MiB, NotAFile, read_text

MAX_FILE_BYTES = MiB  # the web config, and each certificate, key and CA file it names

CLIENT_AUTH = (
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
)
TLS_VERSIONS = ("TLS10", "TLS11", "TLS12", "TLS13")
HEADERS = (
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
)
# Go's crypto/tls names of the suites tls.CipherSuites() offers (the only ones exporter-toolkit accepts) and
# OpenSSL's names for them. TLS 1.3 suites are not configurable in Go either: accepted, nothing to set.
CIPHER_SUITES = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": "",
    "TLS_AES_256_GCM_SHA384": "",
    "TLS_CHACHA20_POLY1305_SHA256": "",
}
_TLS_KEYS = (
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
_UNSUPPORTED = {
    "client_allowed_sans": "gpumon cannot check a client certificate's SANs; issue client "
    "certificates from a CA that signs only the allowed clients and name it in client_ca_file",
    "curve_preferences": "gpumon uses OpenSSL's curve selection and cannot restrict it; remove the key",
}
_BCRYPT = re.compile(r"\$2[abxy]\$(0[4-9]|[12]\d|3[01])\$[./A-Za-z0-9]{53}")  # costs 4-31, as Go checks
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str | None = None
    key_file: str | None = None
    cert: str | None = None  # inline PEM, instead of cert_file
    key: str | None = field(default=None, repr=False)
    client_auth_type: str = "NoClientCert"
    client_ca_file: str | None = None
    client_ca: str | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()
    prefer_server_cipher_suites: bool = True

    @property
    def verifies_clients(self) -> bool:
        return self.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")

    def files(self) -> tuple[str, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)


@dataclass(frozen=True)
class RateLimit:
    interval: float  # seconds between requests on average
    burst: int


@dataclass(frozen=True)
class WebConfig:
    path: str
    tls: TlsSettings | None = None
    users: dict[str, bytes] = field(default_factory=dict, repr=False)  # user -> bcrypt hash
    headers: tuple[tuple[str, str], ...] = ()
    http2: bool = True  # accepted for compatibility; gpumon serves HTTP/1.1
    rate_limit: RateLimit | None = None

    def files(self) -> tuple[str, ...]:
        """The files whose change means the configuration changed: this one and the TLS files it names."""
        return (self.path, *(self.tls.files() if self.tls else ()))


class WebConfigError(ConfigError):
    pass


def load(path: str) -> WebConfig:
    try:
        data = yaml.safe_load(read_text(path, MAX_FILE_BYTES))
    except NotAFile as exc:  # a directory, a device, too large, not UTF-8
        raise WebConfigError(f"web config {path} {exc}") from None
    except OSError as exc:
        raise WebConfigError(f"cannot read web config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise WebConfigError(f"web config {path} is not valid YAML: {_one_line(exc)}") from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise WebConfigError(f"web config {path} nests deeper than any setting") from None
    return parse(data, path)


def parse(data: Any, path: str) -> WebConfig:
    """Validate the decoded file. File names are relative to the file's directory, as in Prometheus."""
    where = f"web config {path}"
    if data is None:
        data = {}
    _mapping(data, where, ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"))
    base = os.path.dirname(os.path.abspath(path))
    http = data.get("http_server_config") or {}
    _mapping(http, f"{where}: http_server_config", ("http2", "headers"))
    return WebConfig(
        path=path,
        tls=_tls(data.get("tls_server_config"), f"{where}: tls_server_config", base),
        users=_users(data.get("basic_auth_users"), f"{where}: basic_auth_users"),
        headers=_headers(http.get("headers"), f"{where}: http_server_config.headers"),
        http2=_bool(http.get("http2", True), f"{where}: http_server_config.http2"),
        rate_limit=_rate_limit(data.get("rate_limit"), f"{where}: rate_limit"),
    )


def _mapping(value: Any, where: str, known: tuple[str, ...]) -> None:
    if not isinstance(value, dict):
        raise WebConfigError(f"{where}: expected a mapping of keys to values, got {type(value).__name__}")
    for key in value:
        if key not in known:
            raise WebConfigError(f"{where}: unknown key {key!r} (known: {', '.join(known)})")


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise WebConfigError(f"{where}: expected true or false, got {value!r}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise WebConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _tls(raw: Any, where: str, base: str) -> TlsSettings | None:
    if raw is None or raw == {}:
        return None
    _mapping(raw, where, _TLS_KEYS)
    for key, why in _UNSUPPORTED.items():
        if raw.get(key):
            raise WebConfigError(f"{where}: {key} is not supported: {why}")
    text = {k: _string(raw[k], f"{where}.{k}") for k in _TLS_KEYS if k in raw and isinstance(raw[k], str)}
    for key in ("cert_file", "key_file", "client_ca_file"):
        if key in raw:
            text[key] = os.path.join(base, _string(raw[key], f"{where}.{key}"))
    for inline, filename in (("cert", "cert_file"), ("key", "key_file"), ("client_ca", "client_ca_file")):
        if inline in text and filename in text:
            raise WebConfigError(f"{where}: give {inline} (inline PEM) or {filename}, not both")
    if "cert" not in text and "cert_file" not in text:
        raise WebConfigError(f"{where}: cert_file (or cert) is required to serve TLS")
    if "key" not in text and "key_file" not in text:
        raise WebConfigError(f"{where}: key_file (or key) is required to serve TLS")
    auth = raw.get("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH:
        raise WebConfigError(
            f"{where}.client_auth_type: expected one of {', '.join(CLIENT_AUTH)}, got {auth!r}"
        )
    if auth == "RequireAnyClientCert":
        raise WebConfigError(
            f"{where}.client_auth_type: RequireAnyClientCert (a certificate nobody verifies) is not "
            "supported; "
            "use RequireAndVerifyClientCert with client_ca_file"
        )
    has_ca = "client_ca" in text or "client_ca_file" in text
    if auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not has_ca:
        raise WebConfigError(f"{where}: client_auth_type {auth} needs client_ca_file (or client_ca)")
    if has_ca and auth in ("NoClientCert", "RequestClientCert"):
        raise WebConfigError(
            f"{where}: a client CA is configured but client_auth_type is {auth}, so it would not be used; "
            "set client_auth_type: RequireAndVerifyClientCert"
        )
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        versions[key] = raw.get(key, default)
        if versions[key] not in TLS_VERSIONS:
            raise WebConfigError(
                f"{where}.{key}: expected one of {', '.join(TLS_VERSIONS)}, got {raw[key]!r}"
            )
    if TLS_VERSIONS.index(versions["min_version"]) > TLS_VERSIONS.index(versions["max_version"]):
        raise WebConfigError(f"{where}: min_version {versions['min_version']} is above max_version")
    suites = raw.get("cipher_suites") or []
    if not isinstance(suites, list):
        raise WebConfigError(f"{where}.cipher_suites: expected a list of Go cipher suite names")
    for suite in suites:
        if not isinstance(suite, str) or suite not in CIPHER_SUITES:
            raise WebConfigError(
                f"{where}.cipher_suites: unknown or insecure suite {suite!r} "
                f"(known: {', '.join(CIPHER_SUITES)})"
            )
    return TlsSettings(
        cert_file=text.get("cert_file"),
        key_file=text.get("key_file"),
        cert=text.get("cert"),
        key=text.get("key"),
        client_auth_type=auth,
        client_ca_file=text.get("client_ca_file"),
        client_ca=text.get("client_ca"),
        min_version=versions["min_version"],
        max_version=versions["max_version"],
        cipher_suites=tuple(suites),
        prefer_server_cipher_suites=_bool(
            raw.get("prefer_server_cipher_suites", True), f"{where}.prefer_server_cipher_suites"
        ),
    )


def _users(raw: Any, where: str) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise WebConfigError(f"{where}: expected a mapping of user names to bcrypt hashes")
    users = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"{where}: bad user name {user!r} (a non-empty string without ':')")
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed):
            raise WebConfigError(
                f"{where}.{user}: expected a bcrypt hash such as $2y$10$… (make one with "
                "`htpasswd -nBC 10 \"\" | tr -d ':\\n'`), not a plain password"
            )
        users[user] = hashed.encode()
    return users


def _headers(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    _mapping(raw, where, HEADERS)
    out = []
    for name, value in raw.items():
        if value in (None, ""):
            continue  # blank: unset, as in exporter-toolkit
        if not isinstance(value, str) or not value.isprintable():
            raise WebConfigError(f"{where}.{name}: expected a printable string, got {value!r}")
        if name == "X-Frame-Options" and value.lower() not in ("deny", "sameorigin"):
            raise WebConfigError(f"{where}.{name}: expected deny or sameorigin, got {value!r}")
        if name == "X-Content-Type-Options" and value.lower() != "nosniff":
            raise WebConfigError(f"{where}.{name}: expected nosniff, got {value!r}")
        out.append((name, value))
    return tuple(out)


def _rate_limit(raw: Any, where: str) -> RateLimit | None:
    if raw is None:
        return None
    _mapping(raw, where, ("interval", "burst"))
    interval = go_duration(raw.get("interval", "0s"), f"{where}.interval")
    burst = raw.get("burst", 0)
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 0:
        raise WebConfigError(f"{where}.burst: expected a whole number of requests, got {burst!r}")
    if interval == 0:
        return None  # 0 turns the limiter off, as in exporter-toolkit
    if burst < 1:
        raise WebConfigError(f"{where}.burst: must be at least 1 when an interval is set")
    return RateLimit(interval, burst)


def go_duration(value: Any, where: str) -> float:
    """A Go duration (``100ms``, ``1s``, ``1m30s``) in seconds; ``0`` is zero."""
    text = str(value).strip()
    if text == "0":
        return 0.0
    total = 0.0
    rest = text
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text):
        total += float(m.group(1)) * _GO_UNITS[m.group(2)]
        rest = rest.replace(m.group(0), "", 1)
    if rest or not text or isinstance(value, bool):
        raise WebConfigError(f"{where}: expected a duration such as 100ms, 1s or 1m, got {value!r}")
    return total


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
