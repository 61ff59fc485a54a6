"""How the operator reaches a model's Prometheus (``spec.autoscaling.prometheus``): the URL, a bearer token or basic
auth, extra headers (the tenant of a multi-tenant store), and the certificate checks of an https:// URL.

The spec names Secrets; the controller reads them (controller/autoscaler.py) and hands this module their values
as a :class:`PrometheusAccess`. :func:`connect` turns one into the query function the autoscaler and the mode
controller use, through prometheus-api-client's ``PrometheusConnect`` (requests underneath): ``headers``,
``auth`` and a ``requests.Session`` whose ``verify`` is the CA bundle's file, ``False`` for insecureSkipVerify,
or ``True`` (the system's CAs).
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from urllib3.util.retry import Retry

QueryFn = Callable[[str], list[dict[str, Any]]]


@dataclass(frozen=True)
class PrometheusAccess:
    """Everything needed to query one Prometheus, with the Secrets already read (values, not references)."""

    url: str
    timeout_seconds: int = 5
    token: str | None = None
    basic_auth: tuple[str, str] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    ca_bundle: str | None = None  # PEM text of the CA(s) that signed the server's certificate
    insecure_skip_verify: bool = False

    def request_headers(self) -> dict[str, str]:
        out = dict(self.headers)
        if self.token:
            out["Authorization"] = f"Bearer {self.token}"
        return out

    def verify(self) -> bool | str:
        """requests' ``verify``: the CA bundle's file, False (no checks), or True (the system's CAs)."""
        if self.insecure_skip_verify:
            return False
        if self.ca_bundle:
            return ca_file(self.ca_bundle)
        return True


def ca_file(pem: str, directory: Path | None = None) -> str:
    """The PEM bundle as a file requests can read (its ``verify`` takes a path), named by its content's hash so
    every tick with the same bundle reuses one file; written atomically (a concurrent reader sees all or none)."""
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError("the CA bundle holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    directory = directory or Path(tempfile.gettempdir())
    path = directory / f"disagg-prometheus-ca-{hashlib.sha256(pem.encode()).hexdigest()[:16]}.pem"
    if not path.exists():
        tmp = path.with_suffix(f".{id(pem)}.tmp")
        tmp.write_text(pem)
        tmp.replace(path)
    return str(path)


def connect(access: PrometheusAccess) -> QueryFn:
    """A query function bound to one Prometheus (retries on connection errors and 502/503/504)."""
    import requests
    from prometheus_api_client import PrometheusConnect

    session = requests.Session()
    session.verify = access.verify()
    prom = PrometheusConnect(url=access.url, headers=access.request_headers() or None, auth=access.basic_auth,
                             session=session, timeout=access.timeout_seconds,
                             retry=Retry(total=2, backoff_factor=0.2, status_forcelist=[502, 503, 504]))
    query: QueryFn = prom.custom_query
    return query


# The operator-wide default (chart values prometheus.*) for models whose spec names no Prometheus.
ENV_URL = "DISAGG_PROMETHEUS_URL"
ENV_TIMEOUT = "DISAGG_PROMETHEUS_TIMEOUT_SECONDS"
ENV_HEADERS = "DISAGG_PROMETHEUS_HEADERS"  # a JSON object: {"X-Scope-OrgID": "team-a"}
ENV_CA_FILE = "DISAGG_PROMETHEUS_CA_FILE"  # a PEM bundle mounted into the operator's pod
ENV_INSECURE = "DISAGG_PROMETHEUS_INSECURE_SKIP_VERIFY"
ENV_TOKEN_FILE = "DISAGG_PROMETHEUS_BEARER_TOKEN_FILE"  # e.g. the pod's service-account token, for a kube-rbac-proxy


def default_from_env(env: Mapping[str, str]) -> PrometheusAccess | None:
    """The operator's default Prometheus from its environment (None when ``DISAGG_PROMETHEUS_URL`` is unset),
    checked once at start-up by the same rules as spec.autoscaling.prometheus; a wrong value raises ValueError
    naming the variable."""
    import json

    from pydantic import ValidationError

    from ..api.rules import rules_for
    from ..api.spec import PrometheusSpec

    url = env.get(ENV_URL)
    if not url:
        return None
    try:
        headers = json.loads(env.get(ENV_HEADERS) or "{}")
    except ValueError as e:
        raise ValueError(f"{ENV_HEADERS}: not a JSON object: {e}") from None
    names = {"url": ENV_URL, "timeoutSeconds": ENV_TIMEOUT, "headers": ENV_HEADERS}
    try:
        spec = PrometheusSpec.model_validate({"url": url, "headers": headers or None,
                                              "timeoutSeconds": env.get(ENV_TIMEOUT) or 5})
    except ValidationError as e:
        raise ValueError("; ".join(f"{names.get(str(err['loc'][0]), ENV_URL)}: {err['msg']}"
                                   for err in e.errors())) from None
    broken = [r.message for r in rules_for(PrometheusSpec) if not r.check(spec)]
    if broken:
        raise ValueError(f"{ENV_HEADERS}: {'; '.join(broken)}")
    insecure = (env.get(ENV_INSECURE) or "false").lower()
    if insecure not in ("true", "false"):
        raise ValueError(f"{ENV_INSECURE}: true or false, got {insecure!r}")
    ca = _read(ENV_CA_FILE, env.get(ENV_CA_FILE))
    if ca is not None and "-----BEGIN CERTIFICATE-----" not in ca:
        raise ValueError(f"{ENV_CA_FILE}: {env[ENV_CA_FILE]} holds no PEM certificate")
    if ca is not None and insecure == "true":
        raise ValueError(f"{ENV_CA_FILE} and {ENV_INSECURE}=true contradict each other: set one")
    token = _read(ENV_TOKEN_FILE, env.get(ENV_TOKEN_FILE))
    return PrometheusAccess(spec.url, spec.timeout_seconds, token=token.strip() if token else None,
                            headers=dict(spec.headers or {}), ca_bundle=ca, insecure_skip_verify=insecure == "true")


def _read(env_name: str, path: str | None) -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text()
    except OSError as e:
        raise ValueError(f"{env_name}: cannot read {path}: {e.strerror}") from None
