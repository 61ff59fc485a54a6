"""The operator reaches Prometheus as clusters run it (issue 31): over TLS signed by a private CA, with basic auth,
with a tenant header — against a real Prometheus (Debian's) started with its own web configuration, and a small
recording server for the headers Prometheus itself ignores."""

from __future__ import annotations

import base64
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import bcrypt
import pytest
import requests
from kubernetes import client
from prometheus_api_client import PrometheusApiClientException

from disagg.api.models import DisaggregatedModel
from disagg.autoscaling.access import (
    ENV_CA_FILE,
    ENV_HEADERS,
    ENV_INSECURE,
    ENV_TIMEOUT,
    ENV_TOKEN_FILE,
    ENV_URL,
    PrometheusAccess,
    ca_file,
    connect,
    default_from_env,
)
from disagg.autoscaling.queries import NOT_CONFIGURED
from disagg.controller import handlers
from disagg.controller.autoscaler import Autoscaler
from disagg.controller.kubeio import Kube
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


# ------------------------------------------------------------------ the controller: which Prometheus a model uses


def _model(prometheus: dict[str, Any] | None = None, enabled: bool = False) -> DisaggregatedModel:
    auto: dict[str, Any] = {"enabled": enabled}
    if prometheus is not None:
        auto["prometheus"] = prometheus
    return DisaggregatedModel.model_validate({
        "apiVersion": "serving.disagg.dev/v1alpha1", "kind": "DisaggregatedModel",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "autoscaling": auto}})


def test_which_prometheus_a_model_is_measured_with() -> None:
    """The model's own spec wins, whole; else the operator's default; else the tick says it is not configured."""
    seen: list[PrometheusAccess] = []

    def factory(access: PrometheusAccess) -> Callable[[str], list[dict[str, Any]]]:
        seen.append(access)
        return lambda _q: []

    default = PrometheusAccess("http://default:9090", headers={"X-Scope-OrgID": "platform"})
    scaler = Autoscaler(kube=Kube(client.ApiClient()), emit=lambda *_: None, query_factory=factory)
    none = scaler.sample(_model(enabled=True), "ns", "m")
    assert none.reason == NOT_CONFIGURED and "prometheus.url" in (none.error or "") and not seen
    scaler.default_access = default
    scaler.sample(_model(), "ns", "m")
    assert seen[-1] is default
    scaler.sample(_model({"url": "http://own:9090", "headers": {"THANOS-TENANT": "t"}}), "ns", "m")
    assert seen[-1].url == "http://own:9090" and dict(seen[-1].headers) == {"THANOS-TENANT": "t"}


def test_the_daemon_runs_for_measured_models_only() -> None:
    assert handlers._measured({"autoscaling": {}}, has_default=False) is False
    assert handlers._measured({"autoscaling": {}}, has_default=True) is True
    assert handlers._measured({"autoscaling": {"enabled": True}}, has_default=False) is True  # says it is blind
    assert handlers._measured({"autoscaling": {"prometheus": {"url": "http://p"}}}, has_default=False) is True


@pytest.mark.apiserver
def test_the_models_secrets_become_its_access(kube: client.ApiClient, namespace: str, pki: Path) -> None:
    core = client.CoreV1Api(kube)
    for name, data in (("prom-token", {"token": "tok\n"}), ("prom-basic", {"user": "u", "pass": "p"}),
                       ("prom-ca", {"ca.crt": (pki / "ca.crt").read_text()})):
        core.create_namespaced_secret(namespace, client.V1Secret(
            metadata=client.V1ObjectMeta(name=name),
            data={k: base64.b64encode(v.encode()).decode() for k, v in data.items()}))
    scaler = Autoscaler(kube=Kube(kube), emit=lambda *_: None)
    spec = _model({"url": "https://p:9090", "basicAuthSecretRef": {"name": "prom-basic", "usernameKey": "user",
                                                                    "passwordKey": "pass"},
                   "tls": {"caSecretRef": {"name": "prom-ca"}}, "headers": {"X-Scope-OrgID": "a"}})
    access = scaler.access(namespace, spec.spec.autoscaling.prometheus)  # type: ignore[arg-type]
    assert access.basic_auth == ("u", "p") and access.token is None
    assert access.ca_bundle == (pki / "ca.crt").read_text() and isinstance(access.verify(), str)  # its file
    bearer = _model({"url": "http://p:9090", "authSecretRef": {"name": "prom-token"}})
    assert scaler.access(namespace, bearer.spec.autoscaling.prometheus).token == "tok"  # type: ignore[arg-type]
    missing = _model({"url": "http://p:9090", "authSecretRef": {"name": "absent"}})
    assert scaler.access(namespace, missing.spec.autoscaling.prometheus).token is None  # type: ignore[arg-type]


# ------------------------------------------------------------------ the operator-wide default (chart prometheus.*)


def test_default_from_env(tmp_path: Path, pki: Path) -> None:
    assert default_from_env({}) is None
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    got = default_from_env({ENV_URL: "https://mimir:8080/prometheus", ENV_HEADERS: '{"X-Scope-OrgID": "llm"}',
                            ENV_TIMEOUT: "10", ENV_CA_FILE: str(pki / "ca.crt"), ENV_TOKEN_FILE: str(token)})
    assert got is not None and got.url == "https://mimir:8080/prometheus" and got.timeout_seconds == 10
    assert dict(got.headers) == {"X-Scope-OrgID": "llm"} and got.token == "sa-token"
    assert got.ca_bundle == (pki / "ca.crt").read_text()


@pytest.mark.parametrize(("env", "named"), [
    ({ENV_URL: "prometheus:9090"}, ENV_URL),
    ({ENV_URL: "http://p", ENV_TIMEOUT: "0"}, ENV_TIMEOUT),
    ({ENV_URL: "http://p", ENV_HEADERS: "X-Scope-OrgID=a"}, ENV_HEADERS),
    ({ENV_URL: "http://p", ENV_HEADERS: '{"Authorization": "Bearer x"}'}, ENV_HEADERS),
    ({ENV_URL: "http://p", ENV_INSECURE: "yes"}, ENV_INSECURE),
    ({ENV_URL: "http://p", ENV_CA_FILE: "/nonexistent/ca.crt"}, ENV_CA_FILE),
    ({ENV_URL: "http://p", ENV_TOKEN_FILE: "/nonexistent/token"}, ENV_TOKEN_FILE),
])
def test_a_wrong_default_names_its_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        default_from_env(env)


def test_the_operator_refuses_to_start_on_a_wrong_default() -> None:
    import os
    import sys

    res = subprocess.run([sys.executable, "-m", "disagg.cli", "operator", "--standalone"],
                         env={**os.environ, ENV_URL: "prometheus:9090"}, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and ENV_URL in res.stderr and "Traceback" not in res.stderr
