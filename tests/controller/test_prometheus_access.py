"""The operator reaches Prometheus as clusters run it (issue 31): over TLS signed by a private CA, with basic auth,
with a tenant header — against a real Prometheus (Debian's) started with its own web configuration, and a small
recording server for the headers Prometheus itself ignores."""

from __future__ import annotations

import base64
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import bcrypt
import pytest
import requests
from prometheus_api_client import PrometheusApiClientException

from disagg.autoscaling.access import PrometheusAccess, ca_file, connect
from disagg.local.prometheus import LocalPrometheus

USER, PASSWORD = "autoscaler", "s3cret-pass"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA and a server certificate for 127.0.0.1 signed by it (openssl, as the control plane does)."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
             "-subj", "/CN=disagg-test-ca", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "1", "-extfile", "san.ext", cwd=d)
    return d


@pytest.fixture(scope="module")
def secured(pki: Path) -> Iterator[LocalPrometheus]:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    prom = LocalPrometheus(web_config={"tls_server_config": {"cert_file": str(pki / "server.crt"),
                                                              "key_file": str(pki / "server.key")},
                                       "basic_auth_users": {USER: hashed}},
                           ca_file=pki / "ca.crt", ready_headers={"Authorization": f"Basic {basic}"})
    with prom:
        yield prom


def test_tls_with_a_private_ca_and_basic_auth(secured: LocalPrometheus, pki: Path) -> None:
    assert secured.url.startswith("https://")
    ca = (pki / "ca.crt").read_text()
    query = connect(PrometheusAccess(secured.url, basic_auth=(USER, PASSWORD), ca_bundle=ca))
    assert query("vector(42)")[0]["value"][1] == "42"


@pytest.mark.parametrize("access", [
    pytest.param({"basic_auth": (USER, PASSWORD)}, id="system-CAs-do-not-know-the-private-CA"),
    pytest.param({"ca": True}, id="no-credentials"),
    pytest.param({"ca": True, "basic_auth": (USER, "wrong")}, id="wrong-password"),
])
def test_refused_without_the_ca_or_the_credentials(secured: LocalPrometheus, pki: Path, access: dict) -> None:
    ca = (pki / "ca.crt").read_text() if access.pop("ca", False) else None
    query = connect(PrometheusAccess(secured.url, ca_bundle=ca, **access))
    if ca is None:
        with pytest.raises(requests.exceptions.SSLError):
            query("vector(1)")
    else:
        with pytest.raises(PrometheusApiClientException, match="401"):
            query("vector(1)")


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")  # what this setting does
def test_insecure_skip_verify_reaches_it_anyway(secured: LocalPrometheus) -> None:
    query = connect(PrometheusAccess(secured.url, basic_auth=(USER, PASSWORD), insecure_skip_verify=True))
    assert query("vector(7)")[0]["value"][1] == "7"


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers.items()))
        body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:  # quiet
        return None


def test_tenant_header_and_bearer_token_on_every_query() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        query = connect(PrometheusAccess(url, token="tok", headers={"X-Scope-OrgID": "team-a"}))
        assert query("up") == []
        (seen,) = _Recorder.seen
        assert seen["X-Scope-OrgID"] == "team-a" and seen["Authorization"] == "Bearer tok"
    finally:
        server.shutdown()
        server.server_close()


def test_ca_file_is_written_once_per_bundle_and_refuses_non_pem(tmp_path: Path, pki: Path) -> None:
    pem = (pki / "ca.crt").read_text()
    first = ca_file(pem, tmp_path)
    assert ca_file(pem, tmp_path) == first and Path(first).read_text() == pem
    assert len(list(tmp_path.iterdir())) == 1
    with pytest.raises(ValueError, match="PEM"):
        ca_file("not a certificate", tmp_path)
