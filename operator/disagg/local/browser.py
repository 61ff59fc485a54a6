"""A headless Chromium (Debian's ``chromium`` package) that opens a local HTML page the way a person would and says
what they would see: whether the page scrolls sideways at a given width, which images and drawings are empty,
which links lead nowhere; and a screenshot.

Driven over the Chrome DevTools Protocol (CDP): ``--remote-debugging-port=0`` on 127.0.0.1, the port read from
the profile's ``DevToolsActivePort`` file, one page target, ``Runtime.evaluate`` and ``Page.captureScreenshot``
over aiohttp's websocket client. ``make demo`` and ``make test`` install the package (hack/ensure-chromium.sh).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ..poll import wait_for
from .procs import HOST, stop_group

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")

# Run in the page once it has loaded: what a reader would notice. Links: a fragment must name an element of the
# page; a relative link a file that exists (checked by the caller, which knows the directory); absolute ones are
# listed for the caller.
_INSPECT = r"""
(async () => {
  document.querySelectorAll('details').forEach(d => { d.open = true; });  // as a reader opening every part
  await Promise.all([...document.images].map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
  const doc = document.documentElement;
  const wide = [...document.body.querySelectorAll('*')]
    .filter(e => e.getBoundingClientRect().right > doc.clientWidth + 1 && !e.closest('.scroll'))
    .slice(0, 10).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className ? '.' + e.className : ''));
  return JSON.stringify({
    width: doc.clientWidth, scrollWidth: doc.scrollWidth, wide,
    title: document.title,
    headings: [...document.querySelectorAll('h1,h2,h3')].map(h => h.textContent.trim()),
    images: [...document.images].map(i => ({src: i.getAttribute('src'), width: i.naturalWidth,
                                            shown: i.getBoundingClientRect().width})),
    drawings: [...document.querySelectorAll('svg')].map(s => ({label: s.getAttribute('aria-label'),
                                                              marks: s.querySelectorAll('rect,path,line').length,
                                                              shown: s.getBoundingClientRect().width})),
    links: [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href')),
    ids: [...document.querySelectorAll('[id]')].map(e => e.id),
    tables: document.querySelectorAll('table').length,
    pre: document.querySelectorAll('pre').length,
  });
})()
"""


def chromium_binary() -> str | None:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageView:
    """What :func:`inspect_page` saw: the viewport's width and the page's scroll width, elements outside the
    viewport (outside a sideways-scrolling box), headings, images (natural width 0: broken), drawings (their
    marks), links, element ids, tables and ``<pre>`` blocks."""

    width: int
    scroll_width: int
    wide: list[str]
    title: str
    headings: list[str]
    images: list[dict[str, Any]]
    drawings: list[dict[str, Any]]
    links: list[str]
    ids: list[str]
    tables: int
    pre: int
    screenshot: Path | None = None
    problems: list[str] = field(default_factory=list)


def broken_links(view: PageView, directory: Path) -> list[str]:
    """Links that lead nowhere: a fragment naming no element, a relative link to a file that does not exist."""
    out = []
    ids = set(view.ids)
    for href in view.links:
        if href.startswith("#"):
            if href[1:] not in ids:
                out.append(href)
        elif "://" not in href and not href.startswith("mailto:") and \
                not (directory / href.split("#", 1)[0]).is_file():
            out.append(href)
    return out


class _CDP:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.next_id = ws, 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        ident = self.next_id
        await self.ws.send_str(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            msg = await self.ws.receive()
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"CDP websocket closed during {method}: {msg.type}")
            data = json.loads(msg.data)
            if data.get("id") == ident:
                if "error" in data:
                    raise RuntimeError(f"CDP {method}: {data['error']}")
                result: dict[str, Any] = data.get("result") or {}
                return result


async def _inspect(port: int, page: Path, width: int, height: int, screenshot: Path | None) -> PageView:
    base = f"http://{HOST}:{port}"
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{base}/json/new?about:blank") as resp:
            target = await resp.json(content_type=None)
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = _CDP(ws)
            await cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                           mobile=False)
            await cdp.call("Page.enable")
            await cdp.call("Page.navigate", url=page.resolve().as_uri())
            # the document is complete when its readyState says so (navigate returns before the load ends)
            for _ in range(200):
                state = await cdp.call("Runtime.evaluate", expression="document.readyState", returnByValue=True)
                if state.get("result", {}).get("value") == "complete":
                    break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"{page} did not finish loading in 10 s")
            out = await cdp.call("Runtime.evaluate", expression=_INSPECT, awaitPromise=True, returnByValue=True)
            if "exceptionDetails" in out:
                raise RuntimeError(f"inspecting {page}: {out['exceptionDetails']}")
            seen = json.loads(out["result"]["value"])
            view = PageView(seen["width"], seen["scrollWidth"], seen["wide"], seen["title"], seen["headings"],
                            seen["images"], seen["drawings"], seen["links"], seen["ids"], seen["tables"],
                            seen["pre"])
            if screenshot is not None:
                shot = await cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
                view.screenshot = screenshot
            return view


def inspect_page(page: Path, width: int = 1400, height: int = 900, screenshot: Path | None = None,
                 binary: str | None = None) -> PageView:
    """Open ``page`` (a local file) in a headless Chromium with a ``width`` × ``height`` viewport and report what
    it shows (:class:`PageView`); with ``screenshot``, also save the whole page as a PNG there."""
    binary = binary or chromium_binary()
    if binary is None:
        raise FileNotFoundError(f"no Chromium found (looked for {', '.join(CANDIDATES)}): "
                                "bash hack/ensure-chromium.sh installs Debian's")
    profile = Path(tempfile.mkdtemp(prefix="disagg-chromium-"))
    args = [binary, "--headless=new", "--remote-debugging-port=0", f"--remote-debugging-address={HOST}",
            f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check", "--disable-gpu",
            "--disable-extensions", "--disable-background-networking", "--allow-file-access-from-files",
            "--hide-scrollbars", "about:blank"]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium refuses to run its sandbox as root
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"

        def port() -> int | None:
            if proc.poll() is not None:
                raise RuntimeError(f"{binary} exited with {proc.returncode} before it opened its DevTools port")
            text = port_file.read_text() if port_file.exists() else ""
            first = text.splitlines()[0] if text else ""
            return int(first) if first.isdigit() else None

        return asyncio.run(_inspect(wait_for(port, 30, "Chromium's DevTools port"), page, width, height,
                                    screenshot))
    finally:
        stop_group(proc, grace=5)
        shutil.rmtree(profile, ignore_errors=True)
