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
