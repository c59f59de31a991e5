"""--web-config: the exporter-toolkit file, TLS with real handshakes on loopback, basic auth, headers, rate
limit, reload while serving, and the errors a mistake in any of them gets."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import httpx
import pytest
import yaml
from support.certs import Certs, make
from support.helpers import ManualClock, run_gpumon, start_daemon

from gpumon.web import webconfig
from gpumon.web.guard import Access, Guard
from gpumon.web.listen import UNIX_SOCKET_SCOPE_KEY
from gpumon.web.tls import server_context
from gpumon.web.webconfig import WebConfigError

PASSWORD = "correct horse battery staple"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()  # cost 4: tests need no slow hashes


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make(tmp_path_factory.mktemp("certs"))


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def tls_section(c: Certs, **extra: object) -> dict[str, object]:
    return {"cert_file": str(c.server_cert), "key_file": str(c.server_key), **extra}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# --- the file ---


def test_full_file_parses(tmp_path: Path, certs: Certs) -> None:
    path = write(
        tmp_path / "web.yml",
        {
            "tls_server_config": tls_section(
                certs,
                client_auth_type="RequireAndVerifyClientCert",
                client_ca_file=str(certs.ca),
                min_version="TLS13",
                cipher_suites=["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
            ),
            "http_server_config": {
                "http2": False,
                "headers": {"X-Frame-Options": "deny", "X-XSS-Protection": ""},
            },
            "basic_auth_users": {"prom": HASH},
            "rate_limit": {"interval": "100ms", "burst": 5},
        },
    )
    config = webconfig.load(str(path))
    assert config.tls is not None and config.tls.verifies_clients and config.tls.min_version == "TLS13"
    assert config.users == {"prom": HASH.encode()}
    assert config.headers == (("X-Frame-Options", "deny"),)  # blank values unset, as in exporter-toolkit
    assert config.rate_limit == webconfig.RateLimit(0.1, 5)
    assert config.files() == (str(path), str(certs.server_cert), str(certs.server_key), str(certs.ca))
    ctx = server_context(config.tls, "t")
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.minimum_version == ssl.TLSVersion.TLSv1_3


def test_relative_paths_are_relative_to_the_file(tmp_path: Path, certs: Certs) -> None:
    sub = tmp_path / "etc"
    sub.mkdir()
    (sub / "c.pem").write_bytes(certs.server_cert.read_bytes())
    path = write(
        sub / "web.yml", {"tls_server_config": {"cert_file": "c.pem", "key_file": str(certs.server_key)}}
    )
    tls = webconfig.load(str(path)).tls
    assert tls is not None and tls.cert_file == str(sub / "c.pem")


def test_empty_file_means_plain_http_without_auth(tmp_path: Path) -> None:
    (tmp_path / "web.yml").write_text("# nothing configured\n")
    config = webconfig.load(str(tmp_path / "web.yml"))
    assert config.tls is None and config.users == {} and config.rate_limit is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"tls_server_config": {"cert_file": "x"}, "basic_auth": {}}, "unknown key 'basic_auth'"),
        ({"basic_auth_users": {"prom": "hunter2"}}, "basic_auth_users.prom: expected a bcrypt hash"),
        ({"basic_auth_users": ["prom"]}, "basic_auth_users: expected a mapping"),
        ({"tls_server_config": {"key_file": "k"}}, "cert_file (or cert) is required"),
        ({"tls_server_config": {"cert_file": "c"}}, "key_file (or key) is required"),
        ({"tls_server_config": {"cert_file": "c", "cert": "PEM", "key_file": "k"}}, "not both"),
        (
            {"tls_server_config": {"cert_file": "c", "key_file": "k", "client_auth_type": "Yes"}},
            "expected one of",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "c",
                    "key_file": "k",
                    "client_auth_type": "RequireAnyClientCert",
                }
            },
            "RequireAnyClientCert (a certificate nobody verifies) is not supported",
        ),
        (
            {"tls_server_config": {"cert_file": "c", "key_file": "k", "client_ca_file": "ca"}},
            "client CA is configured but client_auth_type is NoClientCert",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "c",
                    "key_file": "k",
                    "client_auth_type": "VerifyClientCertIfGiven",
                }
            },
            "needs client_ca_file",
        ),
        ({"tls_server_config": {"cert_file": "c", "key_file": "k", "min_version": "TLS1.2"}}, "min_version"),
        (
            {
                "tls_server_config": {
                    "cert_file": "c",
                    "key_file": "k",
                    "min_version": "TLS13",
                    "max_version": "TLS12",
                }
            },
            "above max_version",
        ),
        (
            {"tls_server_config": {"cert_file": "c", "key_file": "k", "cipher_suites": ["RC4"]}},
            "unknown or insecure",
        ),
        ({"tls_server_config": {"cert_file": "c", "key_file": "k", "client_allowed_sans": ["a"]}}, "SANs"),
        (
            {"tls_server_config": {"cert_file": "c", "key_file": "k", "curve_preferences": ["X25519"]}},
            "curve",
        ),
        ({"http_server_config": {"headers": {"X-Frame-Options": "allow"}}}, "deny or sameorigin"),
        ({"http_server_config": {"headers": {"Server": "x"}}}, "unknown key 'Server'"),
        ({"http_server_config": {"http2": "yes"}}, "http2: expected true or false"),
        ({"rate_limit": {"interval": "fast", "burst": 1}}, "rate_limit.interval: expected a duration"),
        ({"basic_auth_users": {"prom": "$2b$03$" + "a" * 53}}, "expected a bcrypt hash"),  # cost below 4
        ({"basic_auth_users": {"prom": HASH + "\n"}}, "expected a bcrypt hash"),
        ({"tls_server_config": {"cert_file": "c", "key_file": "k", "cipher_suites": [["x"]]}}, "unknown or"),
        ({"rate_limit": {"interval": "1s", "burst": 0}}, "burst: must be at least 1"),
        ([1, 2], "expected a mapping"),
    ],
)
def test_mistakes_are_named(tmp_path: Path, data: object, message: str) -> None:
    path = write(tmp_path / "web.yml", data)
    with pytest.raises(WebConfigError) as exc:
        webconfig.load(str(path))
    assert message in str(exc.value) and str(path) in str(exc.value)


def test_unreadable_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match=r"cannot read web config .*No such file"):
        webconfig.load(str(tmp_path / "missing.yml"))
    (tmp_path / "bad.yml").write_text("basic_auth_users: {prom: [\n")
    with pytest.raises(WebConfigError, match="is not valid YAML"):
        webconfig.load(str(tmp_path / "bad.yml"))


def test_go_durations() -> None:
    assert webconfig.go_duration("1m30s", "d") == 90.0
    assert webconfig.go_duration("250ms", "d") == 0.25
    assert webconfig.go_duration("0", "d") == 0.0
    with pytest.raises(WebConfigError):
        webconfig.go_duration("1 s", "d")


# --- certificates ---


def test_certificate_errors_name_the_file(tmp_path: Path, certs: Certs) -> None:
    def context(**tls: object) -> None:
        config = webconfig.parse({"tls_server_config": tls}, str(tmp_path / "web.yml"))
        assert config.tls is not None
        server_context(config.tls, "web")

    with pytest.raises(WebConfigError, match=r"does not belong to the certificate"):
        context(cert_file=str(certs.server_cert), key_file=str(certs.stranger_key))
    with pytest.raises(WebConfigError, match=r"cannot read .*nope\.pem"):
        context(cert_file=str(tmp_path / "nope.pem"), key_file=str(certs.server_key))
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(WebConfigError, match="not valid PEM"):
        context(cert_file=str(tmp_path / "junk.pem"), key_file=str(certs.server_key))
    encrypted = tmp_path / "enc.key"
    subprocess.run(
        ["openssl", "pkey", "-in", certs.server_key, "-aes256", "-passout", "pass:x", "-out", encrypted],
        check=True,
    )
    with pytest.raises(WebConfigError, match="is encrypted"):
        context(cert_file=str(certs.server_cert), key_file=str(encrypted))
    with pytest.raises(WebConfigError, match="client CA is not a PEM certificate"):
        context(
            cert_file=str(certs.server_cert),
            key_file=str(certs.server_key),
            client_auth_type="RequireAndVerifyClientCert",
            client_ca="garbage",
        )


def test_inline_pem_needs_no_files(certs: Certs) -> None:
    config = webconfig.parse(
        {"tls_server_config": {"cert": certs.server_cert.read_text(), "key": certs.server_key.read_text()}},
        "inline",
    )
    assert config.tls is not None and config.tls.files() == ()
    assert "key=" not in repr(config.tls)  # the secret stays out of logs and tracebacks
    server_context(config.tls, "inline")


# --- the guard, in process ---


def guard_for(tmp_path: Path, data: dict[str, object], clock: ManualClock | None = None) -> Guard:
    config = webconfig.load(str(write(tmp_path / "web.yml", data)))
    return Guard(config, None, clock or ManualClock())


def test_basic_auth_checks(tmp_path: Path) -> None:
    guard = guard_for(tmp_path, {"basic_auth_users": {"prom": HASH}})

    def ok(header: bytes | None) -> bool:
        return asyncio.run(guard.authorized(header))

    good = basic("prom", PASSWORD)["Authorization"].encode()
    assert ok(good) and ok(good)  # the second from the cache
    assert not ok(basic("prom", "wrong")["Authorization"].encode())
    assert not ok(basic("nobody", PASSWORD)["Authorization"].encode())
    assert not ok(None)
    assert not ok(b"Bearer abc")
    assert not ok(b"Basic !!!not-base64")
    assert not ok(b"Basic " + base64.b64encode(b"no-colon"))


def test_rate_limit_is_a_token_bucket(tmp_path: Path) -> None:
    clock = ManualClock()
    guard = guard_for(tmp_path, {"rate_limit": {"interval": "1s", "burst": 2}}, clock)
    assert [guard.admit() for _ in range(3)] == [True, True, False]
    clock.advance(1.0)
    assert guard.admit() and not guard.admit()


def test_reload_follows_the_file_and_keeps_the_old_one_when_broken(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock()
    guard = guard_for(tmp_path, {"basic_auth_users": {"prom": HASH}}, clock)
    other = bcrypt.hashpw(b"new password", bcrypt.gensalt(4)).decode()
    path = write(tmp_path / "web.yml", {"basic_auth_users": {"grafana": other}})
    os.utime(path, ns=(time.time_ns() + 10**9,) * 2)  # a distinct mtime even on coarse filesystems
    guard.maybe_reload()  # within a second of the last check: not looked at yet
    assert "prom" in guard.config.users
    clock.advance(1.0)
    guard.maybe_reload()  # changed: taken only once it holds still for one more check
    assert "prom" in guard.config.users
    clock.advance(1.0)
    guard.maybe_reload()
    assert list(guard.config.users) == ["grafana"]
    path.write_text("basic_auth_users: {grafana: plain-text}\n")
    os.utime(path, ns=(time.time_ns() + 2 * 10**9,) * 2)
    for _ in range(3):
        clock.advance(1.0)
        guard.maybe_reload()
    assert list(guard.config.users) == ["grafana"]
    assert "still serving with the previous web config" in caplog.text
    path.write_text("# emptied\n")
    os.utime(path, ns=(time.time_ns() + 3 * 10**9,) * 2)
    for _ in range(2):
        clock.advance(1.0)
        guard.maybe_reload()
    assert guard.config.users == {} and "/metrics is open to anyone" in caplog.text


def reload_now(guard: Guard, clock: ManualClock) -> None:
    for _ in range(2):
        clock.advance(1.0)
        guard.maybe_reload()


def handshake(server: ssl.SSLContext, ca: Path) -> str:
    """One TLS handshake over a socket pair; the certificate's common name the client saw."""
    a, b = socket.socketpair()
    result: list[BaseException] = []

    def serve() -> None:
        try:
            with server.wrap_socket(a, server_side=True) as s:
                s.recv(1)
        except (OSError, ssl.SSLError) as exc:
            result.append(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    client = ssl.create_default_context(cafile=str(ca))
    client.check_hostname = False
    try:
        with client.wrap_socket(b) as s:
            cert = s.getpeercert()
            s.send(b"x")
    finally:
        thread.join(5)
    assert not result, result
    return dict(x[0] for x in cert["subject"])["commonName"]


def test_a_bad_renewal_leaves_the_running_certificate_alone(
    tmp_path: Path, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(certs.server_cert.read_bytes())
    key.write_bytes(certs.server_key.read_bytes())
    config = webconfig.load(
        str(
            write(
                tmp_path / "web.yml", {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}
            )
        )
    )
    assert config.tls is not None
    ctx = server_context(config.tls, "t")
    clock = ManualClock()
    guard = Guard(config, ctx, clock)
    assert handshake(ctx, certs.ca) == "localhost"
    # a new certificate whose key has not arrived (certbot swaps its links one by one): refused whole
    cert.write_bytes(certs.stranger_cert.read_bytes())
    reload_now(guard, clock)
    assert "does not belong to the certificate" in caplog.text
    assert handshake(ctx, certs.ca) == "localhost"  # the old certificate and key still serve
    key.write_bytes(certs.stranger_key.read_bytes())
    os.utime(key, ns=(time.time_ns() + 10**9,) * 2)
    reload_now(guard, clock)
    assert handshake(ctx, certs.stranger_cert) == "localhost"  # now the new one


def test_a_replaced_client_ca_is_reported_as_needing_a_restart(
    tmp_path: Path, certs: Certs, caplog: pytest.LogCaptureFixture
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(certs.ca.read_bytes())
    tls = tls_section(certs, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(ca))
    config = webconfig.load(str(write(tmp_path / "web.yml", {"tls_server_config": tls})))
    clock = ManualClock()
    assert config.tls is not None
    guard = Guard(config, server_context(config.tls, "t"), clock)
    ca.write_bytes(certs.stranger_cert.read_bytes())
    os.utime(ca, ns=(time.time_ns() + 10**9,) * 2)
    reload_now(guard, clock)
    assert "apply when gpumon restarts" in caplog.text


def test_passwords_longer_than_bcrypt_reads_compare_like_go(tmp_path: Path) -> None:
    long = "x" * 72 + "tail that bcrypt never reads"
    hashed = bcrypt.hashpw(long.encode()[:72], bcrypt.gensalt(4)).decode()
    guard = guard_for(tmp_path, {"basic_auth_users": {"prom": hashed}})
    assert asyncio.run(guard.authorized(basic("prom", long)["Authorization"].encode()))
    assert not asyncio.run(guard.authorized(b"Basic " + b"A" * 8000))  # refused before decoding


def test_a_tcp_request_without_a_peer_address_is_not_trusted(tmp_path: Path) -> None:
    """uvicorn gives client=None when getpeername() fails (a client that resets right after sending)."""
    guard = guard_for(tmp_path, {"basic_auth_users": {"prom": HASH}})
    reached: list[str] = []

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        reached.append(str(scope["path"]))

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    async def call(**scope: object) -> None:
        await Access(app, guard)({"type": "http", "path": "/metrics", "headers": [], **scope}, None, send)

    asyncio.run(call(client=None))
    assert reached == [] and sent[0]["status"] == 401
    asyncio.run(call(client=None, **{UNIX_SOCKET_SCOPE_KEY: True}))
    assert reached == ["/metrics"]


# --- the daemon, over real TLS on loopback ---


class TlsDaemon:
    def __init__(self, tmp_path: Path, certs: Certs, config: dict[str, object], *args: str) -> None:
        self.config_path = write(tmp_path / "web.yml", config)
        self.socket = tmp_path / "ingest.sock"
        self.daemon = start_daemon(
            "--simulate", "2xH100-SXM", "--web-config", str(self.config_path), "--ingest-socket",
            str(self.socket), *args, ready=False,
        )  # fmt: skip
        self.url = self.daemon.url
        self.certs = certs

    def client(self, **kw: object) -> httpx.Client:
        verify = ssl.create_default_context(cafile=str(self.certs.ca))
        cert = kw.pop("cert", None)
        if cert is not None:
            verify.load_cert_chain(*cert)  # type: ignore[misc]
        return httpx.Client(base_url=self.url, verify=verify, timeout=10, **kw)  # type: ignore[arg-type]

    def wait_ready(self, **kw: object) -> None:
        end = time.monotonic() + 20
        with self.client(**kw) as c:
            while time.monotonic() < end:
                try:
                    if c.get("/readyz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
        raise AssertionError("daemon not ready:\n" + "\n".join(self.daemon.log))


@pytest.fixture
def tls_daemon(tmp_path: Path, certs: Certs) -> Iterator[TlsDaemon]:
    d = TlsDaemon(
        tmp_path,
        certs,
        {
            "tls_server_config": tls_section(certs),
            "basic_auth_users": {"prom": HASH},
            "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
        },
        "--ingest-token",
        "t" * 32,
    )
    try:
        d.wait_ready()
        yield d
    finally:
        d.daemon.stop()


def test_tls_and_basic_auth_on_loopback(tls_daemon: TlsDaemon) -> None:
    assert tls_daemon.url.startswith("https://127.0.0.1:")
    with tls_daemon.client() as c:
        anonymous = c.get("/metrics")
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"] == 'Basic realm="gpumon"'
        assert c.get("/metrics", headers=basic("prom", "wrong")).status_code == 401
        assert c.get("/v1/gpus", headers=basic("prom", "wrong")).status_code == 401
        ok = c.get("/metrics", headers=basic("prom", PASSWORD))
        assert ok.status_code == 200 and "gpumon_gpu_utilization_ratio" in ok.text
        assert ok.headers["x-content-type-options"] == "nosniff"
        assert anonymous.headers["x-content-type-options"] == "nosniff"
        for probe in ("/healthz", "/readyz"):  # Kubernetes and Docker probe without credentials
            assert c.get(probe).status_code == 200
        # SDK reports keep their own policy (the token), not the scrape password
        report = c.post("/v1/report", content=b"{}", headers=basic("prom", PASSWORD))
        assert report.status_code == 401 and "bearer token" in report.text
    untrusting = httpx.Client(base_url=tls_daemon.url, timeout=5)  # the system's CAs only
    with untrusting, pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusting.get("/healthz")
    plain = tls_daemon.url.replace("https://", "http://")
    with pytest.raises(httpx.TransportError):
        httpx.get(plain + "/metrics", timeout=5)


def test_unix_socket_stays_plain_http_without_a_password(tls_daemon: TlsDaemon) -> None:
    transport = httpx.HTTPTransport(uds=str(tls_daemon.socket))
    with httpx.Client(transport=transport, base_url="http://localhost", timeout=5) as c:
        assert c.get("/v1/gpus").status_code == 200
        report = c.post("/v1/report", content=b"{}")
        assert report.status_code == 401  # the ingest token still applies on the socket


@pytest.mark.slow
def test_cli_reads_the_daemon_with_credentials_in_the_url(tls_daemon: TlsDaemon) -> None:
    env = {"SSL_CERT_FILE": str(tls_daemon.certs.ca)}
    good = tls_daemon.url.replace("https://", f"https://prom:{PASSWORD.replace(' ', '%20')}@")
    r = run_gpumon("diagnose", "--url", good, env=env)
    assert r.returncode == 0, r.stderr
    assert "No training or inference job" in r.stdout and "prom:***@" in r.stdout  # the password is masked
    r = run_gpumon("diagnose", "--url", good, "--job", "nope", env=env)
    assert r.returncode == 1 and "no job 'nope'" in r.stderr and "staple" not in r.stderr, r.stderr
    wrong = tls_daemon.url.replace("https://", "https://prom:wrong@")
    r = run_gpumon("diagnose", "--url", wrong, env=env)
    assert r.returncode == 1 and "requires basic auth" in r.stderr and "wrong" not in r.stderr


@pytest.mark.slow
def test_client_certificates(tmp_path: Path, certs: Certs) -> None:
    d = TlsDaemon(
        tmp_path,
        certs,
        {
            "tls_server_config": tls_section(
                certs, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(certs.ca)
            )
        },
    )
    try:
        d.wait_ready(cert=(str(certs.client_cert), str(certs.client_key)))
        with d.client(cert=(str(certs.client_cert), str(certs.client_key))) as c:
            assert c.get("/metrics").status_code == 200
        with d.client() as c, pytest.raises(httpx.TransportError):
            c.get("/metrics")  # no certificate: the handshake fails
        with (
            d.client(cert=(str(certs.stranger_cert), str(certs.stranger_key))) as c,
            pytest.raises(httpx.TransportError),
        ):
            c.get("/metrics")  # a certificate the CA did not sign
    finally:
        d.daemon.stop()


@pytest.mark.slow
def test_renewed_certificate_and_new_users_apply_without_restart(tmp_path: Path, certs: Certs) -> None:
    cert, key = tmp_path / "tls.pem", tmp_path / "tls.key"
    cert.write_bytes(certs.server_cert.read_bytes())
    key.write_bytes(certs.server_key.read_bytes())
    d = TlsDaemon(tmp_path, certs, {"tls_server_config": {"cert_file": str(cert), "key_file": str(key)}})
    try:
        d.wait_ready()
        # renew: the stranger's certificate (self-signed) replaces the CA-signed one, and a user appears
        cert.write_bytes(certs.stranger_cert.read_bytes())
        key.write_bytes(certs.stranger_key.read_bytes())
        write(d.config_path, {"tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
                              "basic_auth_users": {"prom": HASH}})  # fmt: skip
        stranger = ssl.create_default_context(cafile=str(certs.stranger_cert))
        end = time.monotonic() + 15
        status = None
        while time.monotonic() < end and status != 401:
            time.sleep(0.3)
            try:  # a new connection each time: a new handshake
                with httpx.Client(base_url=d.url, verify=stranger, timeout=5) as c:
                    status = c.get("/metrics").status_code
            except httpx.TransportError:
                status = None  # still the old certificate
        assert status == 401, "\n".join(d.daemon.log)
        assert any("reloaded (1 basic auth users)" in line for line in d.daemon.log)
    finally:
        d.daemon.stop()


@pytest.mark.slow
def test_rate_limit_over_http(tmp_path: Path, certs: Certs) -> None:
    d = TlsDaemon(tmp_path, certs, {"rate_limit": {"interval": "1m", "burst": 2}})
    try:
        d.daemon.wait_ready()  # plain HTTP: no TLS section
        codes = [d.daemon.get("/metrics").status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        assert d.daemon.get("/healthz").status_code == 200  # probes are not limited
    finally:
        d.daemon.stop()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"basic_auth_users": {"prom": "plaintext"}}, "expected a bcrypt hash"),
        (
            {"tls_server_config": {"cert_file": "/nonexistent/cert.pem", "key_file": "/nonexistent/k"}},
            "cannot read",
        ),
    ],
)
def test_bad_config_stops_startup_with_one_line(
    tmp_path: Path, config: dict[str, object], message: str
) -> None:
    path = write(tmp_path / "web.yml", config)
    r = run_gpumon("serve", "--simulate", "1xH100-SXM", "--listen", "127.0.0.1:0", "--web-config", str(path))
    assert r.returncode == 2
    assert message in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("nested", "nests deeper than any setting"),
        ("dev-zero", "is not a regular file"),
        ("too large", "is larger than 1 MiB"),
        ("cert dev-zero", "/dev/zero is not a regular file"),
        ("key fifo", "is not a regular file"),
        ("client CA dev-zero", "/dev/zero is not a regular file"),
    ],
)
def test_a_web_config_or_a_file_it_names_that_is_no_such_file_stops_startup_with_one_line(
    tmp_path: Path, certs: Certs, case: str, message: str
) -> None:
    path = tmp_path / "web.yml"
    if case == "nested":
        path.write_text("tls_server_config: " + "[" * 5000 + "]" * 5000)
    elif case == "dev-zero":
        path = Path("/dev/zero")
    elif case == "too large":
        path.write_text("# " + "x" * (1 << 20))
    elif case == "cert dev-zero":
        write(path, {"tls_server_config": tls_section(certs, cert_file="/dev/zero")})
    elif case == "key fifo":
        os.mkfifo(tmp_path / "key.pem")  # opened without blocking: no writer needed
        write(path, {"tls_server_config": tls_section(certs, key_file=str(tmp_path / "key.pem"))})
    else:
        tls = tls_section(certs, client_auth_type="RequireAndVerifyClientCert", client_ca_file="/dev/zero")
        write(path, {"tls_server_config": tls})
    r = run_gpumon("serve", "--simulate", "1xH100-SXM", "--listen", "127.0.0.1:0", "--web-config", str(path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_mismatched_key_stops_startup(tmp_path: Path, certs: Certs) -> None:
    path = write(
        tmp_path / "web.yml", {"tls_server_config": tls_section(certs, key_file=str(certs.stranger_key))}
    )
    r = run_gpumon("serve", "--simulate", "1xH100-SXM", "--listen", "127.0.0.1:0", "--web-config", str(path))
    assert r.returncode == 2 and "does not belong to the certificate" in r.stderr, r.stderr


def test_sim_job_with_tls_needs_the_socket(tmp_path: Path, certs: Certs) -> None:
    path = write(tmp_path / "web.yml", {"tls_server_config": tls_section(certs)})
    r = run_gpumon(
        "serve",
        "--simulate",
        "2xH100-SXM",
        "--sim-job",
        "j:0-1",
        "--listen",
        "127.0.0.1:0",
        "--web-config",
        str(path),
    )
    assert r.returncode == 2 and "--ingest-socket" in r.stderr, r.stderr


@pytest.mark.slow
def test_sim_job_reports_over_the_socket_beside_tls(tmp_path: Path, certs: Certs) -> None:
    d = TlsDaemon(
        tmp_path, certs, {"tls_server_config": tls_section(certs), "basic_auth_users": {"prom": HASH}},
        "--sim-job", "demo:0-1",
    )  # fmt: skip
    try:
        d.wait_ready()
        with d.client(headers=basic("prom", PASSWORD)) as c:
            end = time.monotonic() + 20
            jobs: list[object] = []
            while time.monotonic() < end and not jobs:
                jobs = json.loads(c.get("/v1/jobs").text)["jobs"]
                time.sleep(0.3)
        assert jobs, "\n".join(d.daemon.log)
    finally:
        d.daemon.stop()


def test_the_shipped_example_parses() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "access" / "web-config.yml"
    config = webconfig.load(str(example))
    assert config.tls is not None and config.tls.min_version == "TLS12"
    assert list(config.users) == ["prometheus"]


def test_a_content_security_policy_in_the_web_config_is_warned_about(tmp_path: Path, caplog) -> None:
    """Both policies are enforced, so one stricter than the node page's stops it drawing (found by review)."""
    import logging

    from gpumon.cli.serve import _access
    from gpumon.config import Settings

    headers = {"Content-Security-Policy": "default-src 'self'"}
    path = write(tmp_path / "web.yml", {"http_server_config": {"headers": headers}})
    with caplog.at_level(logging.WARNING, logger="gpumon"):
        _access(Settings(web_config=str(path)))
    assert "sets a Content-Security-Policy header" in caplog.text and "node page" in caplog.text
