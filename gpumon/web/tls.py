"""The listener's TLS context from ``tls_server_config``.

Loading happens before the server starts, so a missing file, a key that does not match its certificate or
an encrypted key ends startup with one line naming the file, not a failed handshake later. A renewed
certificate (cert-manager, certbot) is loaded into the same context while serving: see guard.py.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import Iterator

from gpumon.files import NotAFile, read_bounded
from gpumon.web.webconfig import CIPHER_SUITES, MAX_FILE_BYTES, TlsSettings, WebConfigError

_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}


def server_context(tls: TlsSettings, where: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.minimum_version = _VERSIONS[tls.min_version]
        ctx.maximum_version = _VERSIONS[tls.max_version]
    except (ValueError, ssl.SSLError) as exc:
        raise WebConfigError(f"{where}: this OpenSSL refuses the TLS versions asked for: {exc}") from None
    openssl = [CIPHER_SUITES[s] for s in tls.cipher_suites if CIPHER_SUITES[s]]
    if openssl:
        try:
            ctx.set_ciphers(":".join(openssl))
        except ssl.SSLError:
            raise WebConfigError(f"{where}.cipher_suites: this OpenSSL offers none of them") from None
    if not tls.prefer_server_cipher_suites:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    load_certificate(ctx, tls, where)
    if tls.verifies_clients:
        ctx.verify_mode = (
            ssl.CERT_REQUIRED if tls.client_auth_type == "RequireAndVerifyClientCert" else ssl.CERT_OPTIONAL
        )
        # read here, bounded, not by OpenSSL from the path: a device there would be read without end
        ca = _read(tls.client_ca_file, tls.client_ca, where)
        try:
            ctx.load_verify_locations(cadata=ca.decode("ascii", errors="replace"))
        except (ssl.SSLError, ValueError) as exc:
            raise WebConfigError(f"{where}: the client CA is not a PEM certificate: {_reason(exc)}") from None
    return ctx


def load_certificate(ctx: ssl.SSLContext, tls: TlsSettings, where: str) -> None:
    """Load the certificate chain and key into ``ctx``; also used to reload a renewed certificate. Both are
    read once and tried on a scratch context first: OpenSSL drops a live context's old key as soon as a
    certificate with another key goes in, so a bad new key must never reach ``ctx``."""
    cert = _read(tls.cert_file, tls.cert, where)
    key = _read(tls.key_file, tls.key, where)
    _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cert, key, tls, where)
    _load(ctx, cert, key, tls, where)


def _read(path: str | None, inline: str | None, where: str) -> bytes:
    if path is None:
        return (inline or "").encode()
    try:
        return read_bounded(path, MAX_FILE_BYTES)
    except NotAFile as exc:
        raise WebConfigError(f"{where}: {path} {exc}") from None
    except OSError as exc:
        raise WebConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None


def _load(ctx: ssl.SSLContext, cert: bytes, key: bytes, tls: TlsSettings, where: str) -> None:
    try:
        with _pem(cert) as cert_path, _pem(key) as key_path:
            ctx.load_cert_chain(cert_path, key_path, password=_encrypted)
    except _Encrypted:
        raise WebConfigError(
            f"{where}: the private key {tls.key_file or '(inline key)'} is encrypted; gpumon needs an "
            "unencrypted PEM key readable only by its user"
        ) from None
    except ssl.SSLError as exc:
        reason = _reason(exc)
        if "KEY_VALUES_MISMATCH" in reason.upper():
            raise WebConfigError(
                f"{where}: the key {tls.key_file or '(inline key)'} does not belong to the certificate "
                f"{tls.cert_file or '(inline cert)'}"
            ) from None
        raise WebConfigError(
            f"{where}: the certificate or key is not valid PEM ({reason}): cert "
            f"{tls.cert_file or '(inline)'}, key {tls.key_file or '(inline)'}"
        ) from None


class _Encrypted(Exception):
    pass


def _encrypted() -> bytes:
    raise _Encrypted  # OpenSSL asks for a passphrase only when the key is encrypted


@contextlib.contextmanager
def _pem(data: bytes) -> Iterator[str]:
    """A path OpenSSL can open holding ``data``: an anonymous in-memory file, so what was read once is what
    is loaded, and an inline key never touches the disk."""
    fd = os.memfd_create("gpumon-pem", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def _reason(exc: Exception) -> str:
    return getattr(exc, "reason", None) or " ".join(str(exc).split())
