"""Worker scraping: every worker's /metrics each interval → load estimates (load.Worker) and router gauges."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp

from .load import Worker, WorkerSet, parse_prometheus
from .metrics import RouterMetrics


class Scraper:
    def __init__(self, workers: WorkerSet, metrics: RouterMetrics, session: Callable[[], aiohttp.ClientSession],
                 interval: float, timeout: float, down_seconds: float) -> None:
        self.workers = workers
        self.metrics = metrics
        self.session = session
        self.interval = interval
        self.timeout = timeout
        self.down_seconds = down_seconds

    async def scrape_one(self, w: Worker) -> None:
        try:
            async with self.session().get(w.url + "/metrics",
                                          timeout=aiohttp.ClientTimeout(total=self.timeout)) as r:
                if r.status != 200:
                    return
                text = await r.text()
            w.update_scrape(parse_prometheus(text), self.workers.clock())
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError):
            w.down_until = self.workers.clock() + self.down_seconds
        except (TimeoutError, aiohttp.ClientError, ValueError):
            pass

    async def run(self) -> None:
        while True:
            ws = self.workers.all()
            if ws:
                await asyncio.gather(*(self.scrape_one(w) for w in ws), return_exceptions=True)
            for pool in WorkerSet.ROLES:
                self.metrics.workers.labels(pool).set(len(self.workers.ready(pool)))
            ests = [w.est_prefill_wait_s() for w in self.workers.ready("prefill")]
            self.metrics.prefill_wait_estimate.set(min(ests) if ests else 0.0)
            await asyncio.sleep(self.interval)
