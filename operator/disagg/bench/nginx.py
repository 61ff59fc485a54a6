"""nginx as the baseline proxy of the router benchmark (bench/router_bench.py): found on the machine (``make test``
installs it: hack/ensure-nginx.sh), run in the foreground with its own prefix, config and logs under the run's
temporary directory (nothing outside it is touched), proxying to one upstream with keep-alive and no buffering."""

from __future__ import annotations

import os
import shutil

from ..local.procs import HOST, Proc, Processes, free_port

NGINX_CONF = """\
worker_processes 1;
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp-body;
    proxy_temp_path {dir}/tmp-proxy;
    fastcgi_temp_path {dir}/tmp-fastcgi;
    uwsgi_temp_path {dir}/tmp-uwsgi;
    scgi_temp_path {dir}/tmp-scgi;
    upstream sim {{ server {upstream}; keepalive 1024; }}
    server {{
        listen {host}:{port};
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


def find_nginx(explicit: str | None = None) -> str | None:
    for c in [explicit, shutil.which("nginx"), "/usr/sbin/nginx"]:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def start_nginx(procs: Processes, binary: str, upstream: str) -> Proc:
    d = procs.log_dir / "nginx"
    d.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (d / "nginx.conf").write_text(NGINX_CONF.format(dir=d, upstream=upstream, host=HOST, port=port))
    # foreground (daemon off), own prefix and error log: nothing outside the temp directory is touched
    p = procs.spawn("nginx", [binary, "-p", str(d), "-e", str(d / "error.log"), "-c", str(d / "nginx.conf"),
                              "-g", "daemon off;"], f"http://{HOST}:{port}", role="nginx")
    return p


def nginx_version(binary: str | None) -> str | None:
    if not binary:
        return None
    import subprocess

    try:
        out = subprocess.run([binary, "-v"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stderr or out.stdout).strip().removeprefix("nginx version: ").removeprefix("nginx/") or None
