"""TLS and basic auth on the exporter's endpoint; TLS, client certificates and a bearer
token towards vLLM. Real TLS on loopback (certificates made in the test), real bcrypt,
and a real Prometheus scraping over TLS with basic auth."""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import re
import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest
import yaml
from prometheus_client import generate_latest
from vllm_glassbox.core.fetch import TargetCredentials
from vllm_glassbox.core.prometheus import Prometheus, PrometheusError
from vllm_glassbox.exporter.cli import main as exporter_main
from vllm_glassbox.exporter.service import ExporterConfig, Poller, make_registry, make_server
from vllm_glassbox.exporter.webconfig import (
    BasicAuth,
    WebConfigError,
    WebConfigSource,
    load_web_config,
)
from vllm_glassbox.lab.backends.prometheus_process import PrometheusProcess
from vllm_glassbox.probe import main as probe_main

from tests.k8s_double import wait_until
from tests.misbehaving import FakeVllm, Misbehaving, guarded, healthy
from tests.tlsfiles import Pki, make_pki

PASSWORD = "correct horse battery staple"
USER = "prometheus"


def bcrypt_hash(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=cost)).decode()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def write_web_config(path: Path, pki: Pki, users: dict[str, str] | None = None,
                     client_auth: bool = False) -> Path:  # fmt: skip
    tls: dict[str, Any] = {"cert_file": str(pki.server.cert), "key_file": str(pki.server.key)}
    if client_auth:
        tls |= {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": str(pki.ca)}
    data: dict[str, Any] = {"tls_server_config": tls}
    if users is not None:
        data["basic_auth_users"] = users
    path.write_text(yaml.safe_dump(data))
    return path


def client_context(pki: Pki, client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if client_cert:
        context.load_cert_chain(pki.client.cert, pki.client.key)
    return context


@contextlib.contextmanager
def exporter(web_config: Path, target: str = "http://127.0.0.1:1") -> Iterator[str]:
    """A real exporter (make_server + Poller.run) serving with `web_config`."""
    poller = Poller(ExporterConfig(target=target, interval_seconds=0.2, window_seconds=2,
                                   timeout_seconds=1))  # fmt: skip
    server = make_server(poller, "127.0.0.1", 0, WebConfigSource(web_config))
    stop = threading.Event()
    threading.Thread(target=poller.run, args=(stop,), daemon=True).start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://localhost:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def get(url: str, context: ssl.SSLContext, auth: tuple[str, str] | None = None) -> httpx.Response:
    return httpx.get(url, verify=context, auth=auth, timeout=10)


# -- the web-config file --------------------------------------------------------------------


@pytest.mark.prometheus
def test_the_web_config_format_is_prometheus_own(tmp_path: Path, pki: Pki) -> None:
    path = write_web_config(tmp_path / "web.yml", pki, {USER: bcrypt_hash(PASSWORD)}, True)
    check = subprocess.run(["promtool", "check", "web-config", str(path)],
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    config = load_web_config(path)
    assert config.tls is not None and config.tls.verify_mode == ssl.CERT_REQUIRED
    assert list(config.users) == [USER]


def test_relative_paths_are_read_from_the_files_directory(tmp_path: Path, pki: Pki) -> None:
    for f in (pki.server.cert, pki.server.key):
        shutil.copy(f, tmp_path / f.name)
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"tls_server_config": {
        "cert_file": pki.server.cert.name, "key_file": pki.server.key.name}}))  # fmt: skip
    assert load_web_config(path).tls is not None


SECRET_LOOKING = "plaintext-password-not-a-hash"
BAD_CONFIGS: list[tuple[str, Any, str]] = [
    ("unknown key", {"http_server_config": {"http2": False}},
     "http_server_config: not supported by glassbox"),
    ("key without cert", {"tls_server_config": {"key_file": "x.key"}},
     "tls_server_config.cert_file and tls_server_config.key_file are both required"),
    ("missing files", {"tls_server_config": {"cert_file": "nope.crt", "key_file": "nope.key"}},
     "cannot load"),
    ("CA without a policy", {"tls_server_config": {"cert_file": "{cert}", "key_file": "{key}",
                                                   "client_ca_file": "{ca}"}},
     "client_ca_file is set, but client_auth_type is NoClientCert"),
    ("policy without CA", {"tls_server_config": {
        "cert_file": "{cert}", "key_file": "{key}",
        "client_auth_type": "RequireAndVerifyClientCert"}},
     "client_auth_type RequireAndVerifyClientCert needs client_ca_file"),
    ("unverified client certs", {"tls_server_config": {
        "cert_file": "{cert}", "key_file": "{key}", "client_auth_type": "RequestClientCert"}},
     "client_auth_type: 'RequestClientCert' not supported"),
    ("old TLS", {"tls_server_config": {"cert_file": "{cert}", "key_file": "{key}",
                                       "min_version": "TLS11"}},
     "min_version: 'TLS11' not supported"),
    ("a password, not a hash", {"basic_auth_users": {USER: SECRET_LOOKING}},
     "basic_auth_users.prometheus: not a bcrypt hash"),
    ("not a mapping", ["a", "list"], "expected a mapping at the top level"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "message"), [c[1:] for c in BAD_CONFIGS],
                         ids=[c[0] for c in BAD_CONFIGS])  # fmt: skip
def test_a_bad_web_config_is_refused_naming_the_key_and_no_secret(
    tmp_path: Path, pki: Pki, data: Any, message: str
) -> None:
    text = yaml.safe_dump(data).format(cert=pki.server.cert, key=pki.server.key, ca=pki.ca)
    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(WebConfigError, match=message) as refused:
        load_web_config(path)
    assert SECRET_LOOKING not in str(refused.value)


def test_the_exporter_refuses_to_start_with_a_bad_web_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump({"basic_auth_users": {USER: SECRET_LOOKING}}))
    assert exporter_main(["--web-config-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--web-config-file: basic_auth_users.prometheus: not a bcrypt hash" in err
    assert SECRET_LOOKING not in err


# -- TLS and basic auth on /metrics ---------------------------------------------------------


def test_tls_and_basic_auth_guard_metrics(tmp_path: Path, pki: Pki) -> None:
    web = write_web_config(tmp_path / "web.yml", pki, {USER: bcrypt_hash(PASSWORD)})
    trust = client_context(pki)
    with exporter(web) as url:
        nobody = get(url + "/metrics", trust)
        assert nobody.status_code == 401
        assert nobody.headers["WWW-Authenticate"].startswith('Basic realm="glassbox"')
        assert get(url + "/metrics", trust, (USER, "wrong")).status_code == 401
        assert get(url + "/metrics", trust, ("mallory", PASSWORD)).status_code == 401
        good = get(url + "/metrics", trust, (USER, PASSWORD))
        assert good.status_code == 200 and "glassbox_target_up 0.0" in good.text
        # A liveness probe needs no credentials; it says nothing but "ok".
        assert get(url + "/healthz", trust).text == "ok\n"
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
            httpx.get(url.replace("https", "http") + "/healthz", timeout=10)
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            get(url + "/healthz", ssl.create_default_context())  # the system's CAs


def test_the_probe_reads_an_exporter_over_tls_with_basic_auth_from_files(
    tmp_path: Path, pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    """`glassbox probe` as the chart's helm test runs it against a locked-down exporter."""
    web = write_web_config(tmp_path / "web.yml", pki, {USER: bcrypt_hash(PASSWORD)})
    (tmp_path / "username").write_text(USER + "\n")
    (tmp_path / "password").write_text(PASSWORD + "\n")
    files = ["--username-file", str(tmp_path / "username"),
             "--password-file", str(tmp_path / "password")]  # fmt: skip
    with Misbehaving(FakeVllm()) as target:
        target.behave(healthy(target.fake))
        with exporter(web, target.url) as url:
            args = ["--exporter", url, "--ca-file", str(pki.ca), *files]
            wait_until(lambda: probe_main(args) == 0, timeout=30)  # after its first poll
            capsys.readouterr()
            (tmp_path / "password").write_text("guess-4711")
            assert probe_main(args) == 1
            assert probe_main(["--exporter", url, *files]) == 1  # the CA not trusted
    out = capsys.readouterr().out
    assert f"exporter {url}: FAILED: /metrics: HTTP 401" in out
    assert "CERTIFICATE_VERIFY_FAILED" in out
    assert PASSWORD not in out and "guess-4711" not in out
    with pytest.raises(SystemExit):
        probe_main(["--exporter", url, "--username-file", str(tmp_path / "username")])


def test_over_tls_metrics_negotiates_openmetrics_and_gzip_as_prometheus_asks(
    tmp_path: Path, pki: Pki
) -> None:
    web = write_web_config(tmp_path / "web.yml", pki, {USER: bcrypt_hash(PASSWORD)})
    # Prometheus' own Accept header (2.42, scrape.go), and its Accept-Encoding.
    accept = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
        "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    with exporter(web) as url, httpx.Client(verify=client_context(pki), timeout=10) as client:
        headers = {"Accept": accept, "Accept-Encoding": "gzip"}
        with client.stream(
            "GET", url + "/metrics", headers=headers, auth=(USER, PASSWORD)
        ) as answer:
            body = b"".join(answer.iter_raw())  # as sent: still gzipped
        assert answer.status_code == 200
        assert answer.headers["Content-Encoding"] == "gzip"
        assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
        page = gzip.decompress(body).decode()
        assert page.endswith("# EOF\n") and "glassbox_target_up 0.0" in page


def test_client_certificates_are_required_when_configured(tmp_path: Path, pki: Pki) -> None:
    stranger = make_pki(tmp_path / "other", "stranger")
    web = write_web_config(tmp_path / "web.yml", pki, client_auth=True)
    with exporter(web) as url:
        assert get(url + "/metrics", client_context(pki, client_cert=True)).status_code == 200
        with pytest.raises(httpx.HTTPError):
            get(url + "/metrics", client_context(pki))  # no certificate
        foreign = client_context(pki)
        foreign.load_cert_chain(stranger.client.cert, stranger.client.key)
        with pytest.raises(httpx.HTTPError):
            get(url + "/metrics", foreign)  # a certificate of another CA


def _touch_later(path: Path) -> None:
    """Make a rewrite visible even on a file system with coarse timestamps."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))


def test_changed_files_are_reloaded_and_a_broken_change_keeps_the_last_good_one(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    served = make_pki(tmp_path / "served", "rotating")
    web = write_web_config(tmp_path / "web.yml", served, {USER: bcrypt_hash(PASSWORD)})
    with exporter(web) as url:
        assert get(url + "/metrics", client_context(served), (USER, PASSWORD)).status_code == 200
        # A new password.
        write_web_config(web, served, {USER: bcrypt_hash("new password")})
        _touch_later(web)
        assert get(url + "/metrics", client_context(served), (USER, PASSWORD)).status_code == 401
        assert get(url + "/metrics", client_context(served),
                   (USER, "new password")).status_code == 200  # fmt: skip
        # A rotated certificate, same paths (as cert-manager rewrites a Secret's files).
        renewed = make_pki(tmp_path / "renewed", "renewed")
        for new, old in ((renewed.server.cert, served.server.cert),
                         (renewed.server.key, served.server.key)):  # fmt: skip
            shutil.copy(new, old)
            _touch_later(old)
        assert get(url + "/healthz", client_context(renewed)).status_code == 200
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            get(url + "/healthz", client_context(served))
        # A broken rewrite: logged, and the last good configuration stays.
        with caplog.at_level(logging.ERROR, logger="glassbox.exporter"):
            web.write_text("tls_server_config: [")
            _touch_later(web)
            ok = get(url + "/metrics", client_context(renewed), (USER, "new password"))
        assert ok.status_code == 200
        assert "web config not reloaded, the previous one stays in force" in caplog.text
        assert "glassbox_web_config_last_reload_successful 0.0" in ok.text
        write_web_config(web, renewed, {USER: bcrypt_hash("new password")})  # repaired
        _touch_later(web)
        ok = get(url + "/metrics", client_context(renewed), (USER, "new password"))
        assert "glassbox_web_config_last_reload_successful 1.0" in ok.text


def test_a_verified_password_costs_bcrypt_once_and_an_unknown_user_costs_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = bcrypt.checkpw
    checked: list[bytes] = []

    def counting(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    stored = bcrypt_hash(PASSWORD, cost=5)
    auth = BasicAuth({USER: stored.encode()})

    assert auth.check(USER, PASSWORD.encode()) and len(checked) == 1
    assert auth.check(USER, PASSWORD.encode()) and len(checked) == 1  # cached
    assert not auth.check(USER, b"guess") and len(checked) == 2
    assert auth.check(USER, PASSWORD.encode()) and len(checked) == 2  # still cached
    assert not auth.check("mallory", PASSWORD.encode()) and len(checked) == 3
    # The unknown user was checked against a dummy hash of the same cost.
    assert checked[2] != stored.encode() and checked[2].startswith(b"$2b$05$")


# -- a real Prometheus scrapes it --------------------------------------------------------------


@pytest.mark.prometheus
def test_prometheus_scrapes_over_tls_with_basic_auth_and_the_wrong_password_is_refused(
    tmp_path: Path, pki: Pki
) -> None:
    web = write_web_config(tmp_path / "web.yml", pki, {USER: bcrypt_hash(PASSWORD)})
    for name, secret in (("right", PASSWORD), ("wrong", "guess")):
        (tmp_path / name).write_text(secret)
    with exporter(web) as url:
        hostport = url.removeprefix("https://")
        tls = {"ca_file": str(pki.ca)}

        def job(name: str, auth: dict[str, str] | None) -> dict[str, Any]:
            config: dict[str, Any] = {"job_name": name, "scheme": "https", "tls_config": tls,
                                      "static_configs": [{"targets": [hostport]}]}  # fmt: skip
            if auth is not None:
                config["basic_auth"] = auth
            return config

        jobs = [
            job("right", {"username": USER, "password_file": str(tmp_path / "right")}),
            job("wrong", {"username": USER, "password_file": str(tmp_path / "wrong")}),
            job("nobody", None),
        ]
        config = {"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}
        with PrometheusProcess(tmp_path, config) as prometheus:
            targets = _scraped_targets(prometheus.url, {"right", "wrong", "nobody"})
    assert targets["right"]["health"] == "up", targets["right"]
    for name in ("wrong", "nobody"):
        assert targets[name]["health"] == "down"
        assert "401 Unauthorized" in targets[name]["lastError"]


def _scraped_targets(prometheus: str, jobs: set[str]) -> dict[str, dict[str, Any]]:
    """Each job's active target once it has been scraped (health no longer unknown)."""
    found: dict[str, dict[str, Any]] = {}

    def scraped() -> bool:
        # Until its storage is up Prometheus answers 503 "Service Unavailable" (not JSON).
        with contextlib.suppress(PrometheusError), Prometheus(prometheus, 5) as client:
            for target in client.active_targets():
                if target["health"] != "unknown":
                    found[target["labels"]["job"]] = target
        return jobs <= set(found)

    wait_until(scraped, timeout=120)
    return found


# -- reaching a vLLM behind TLS and a token check ----------------------------------------------


def server_context(pki: Pki, require_client: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server.cert, pki.server.key)
    if require_client:
        context.load_verify_locations(cafile=str(pki.ca))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def target_poller(url: str, credentials: TargetCredentials) -> Poller:
    config = ExporterConfig(target=url, interval_seconds=1, window_seconds=10, timeout_seconds=5,
                            target_credentials=credentials)  # fmt: skip
    return Poller(config)


def test_a_target_behind_tls_with_a_client_certificate_and_a_rotated_token(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    tokens = ["first-token-0123456789"]
    token_file = tmp_path / "token"
    token_file.write_text(tokens[-1] + "\n")
    credentials = TargetCredentials(str(pki.ca), str(pki.client.cert), str(pki.client.key),
                                    str(token_file))  # fmt: skip
    with Misbehaving(FakeVllm(), tls=server_context(pki)) as target:
        target.behave(guarded(healthy(target.fake), lambda: tokens[-1]))
        poller = target_poller(target.url, credentials)
        with caplog.at_level(logging.DEBUG):
            assert poller.poll_once() and poller.poll_once()
            # The proxy's token rotates; the file is rewritten, as a projected token is.
            tokens.append("second-token-9876543210")
            assert not poller.poll_once()
            assert poller.errors == {"http_status": 1}
            token_file.write_text(tokens[-1])
            assert poller.poll_once()
            page = generate_latest(make_registry(poller)).decode()
        poller.fetcher.close()
    assert "glassbox_target_up 1.0" in page
    assert "glassbox_tokens_per_forward_pass{" in page
    key_body = pki.client.key.read_text().splitlines()[1]
    for secret in (*tokens, key_body):
        assert secret not in caplog.text and secret not in page


@pytest.mark.parametrize("wrong", ["untrusted server", "no client certificate"])
def test_a_target_whose_tls_fails_is_down_with_the_reason_said(
    tmp_path: Path, pki: Pki, wrong: str
) -> None:
    stranger = make_pki(tmp_path / "other", "stranger")
    if wrong == "untrusted server":
        credentials = TargetCredentials(str(stranger.ca), str(pki.client.cert), str(pki.client.key))
    else:
        credentials = TargetCredentials(str(pki.ca))
    with Misbehaving(FakeVllm(), tls=server_context(pki)) as target:
        poller = target_poller(target.url, credentials)
        with pytest.raises(Exception) as failed:
            poller.fetcher.get_text("/metrics")
        assert not poller.poll_once()
        poller.fetcher.close()
    assert poller.errors == {"connect": 1}
    expected = (
        "CERTIFICATE_VERIFY_FAILED" if wrong == "untrusted server" else "ConnectError|ReadError"
    )
    assert getattr(failed.value, "reason", None) == "connect"
    assert re.search(expected, str(failed.value)), str(failed.value)


def test_the_target_tls_files_are_reloaded_when_rotated(tmp_path: Path, pki: Pki) -> None:
    renewed = make_pki(tmp_path / "renewed", "renewed")
    ca = tmp_path / "ca.crt"
    shutil.copy(pki.ca, ca)
    with (
        Misbehaving(FakeVllm(), tls=server_context(pki, require_client=False)) as old,
        Misbehaving(FakeVllm(), tls=server_context(renewed, require_client=False)) as new,
    ):
        poller = target_poller(old.url, TargetCredentials(str(ca)))
        assert poller.poll_once()
        poller.fetcher.base_url = new.url  # the same name, now served by the renewed CA's cert
        assert not poller.poll_once()
        shutil.copy(renewed.ca, ca)
        _touch_later(ca)
        assert poller.poll_once()
        poller.fetcher.close()


CLI_PROBLEMS: list[tuple[list[str], str]] = [
    (["--target-cert-file", "{cert}"], "--target-cert-file and --target-key-file go together"),
    (["--target-ca-file", "{ca}"], "--target-ca/cert/key-file need an https:// --target"),
    (["--target", "https://x", "--target-ca-file", "/nonexistent"],
     "--target-ca/cert/key-file: cannot load: No such file or directory"),
    (["--target-bearer-token-file", "/nonexistent"],
     "--target-bearer-token-file: No such file or directory"),
    (["--target", "http://user:hunter2@127.0.0.1:8000"],
     "--target: no credentials in the URL (they would show in logs)"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "message"), CLI_PROBLEMS)
def test_target_credential_flags_are_checked_before_starting(
    pki: Pki, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    argv = [a.format(cert=pki.client.cert, ca=pki.ca) for a in argv]
    assert exporter_main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "hunter2" not in err


def test_an_empty_token_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("\n")
    assert exporter_main(["--target-bearer-token-file", str(tmp_path / "token")]) == 2


def test_without_users_bcrypt_is_not_even_imported(tmp_path: Path, pki: Pki) -> None:
    path = write_web_config(tmp_path / "web.yml", pki)
    code = (
        "import sys; from vllm_glassbox.exporter.webconfig import WebConfigSource; "
        f"WebConfigSource({str(path)!r}).current(); assert 'bcrypt' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
