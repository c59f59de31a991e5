"""Certificates for TLS tests, made by the real openssl command: a CA, a server certificate for loopback
signed by it, a client certificate signed by it, and a stranger (self-signed, trusted by nobody)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from support.helpers import require_tool


@dataclass(frozen=True)
class Certs:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run([require_tool("openssl"), *map(str, args)], cwd=cwd, check=True, capture_output=True)


def make(where: Path) -> Certs:
    where.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=gpumon test CA",
        cwd=where,
    )
    for name, subject, ext in (
        ("server", "/CN=localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        ("client", "/CN=prometheus", "extendedKeyUsage=clientAuth"),
    ):
        (where / f"{name}.ext").write_text(ext + "\n")
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=where)
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.pem",
            cwd=where,
        )
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "stranger.key",
        "-out",
        "stranger.pem",
        "-days",
        "2",
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
        cwd=where,
    )
    return Certs(
        where,
        where / "ca.pem",
        where / "server.pem",
        where / "server.key",
        where / "client.pem",
        where / "client.key",
        where / "stranger.pem",
        where / "stranger.key",
    )
