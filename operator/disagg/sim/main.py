"""Process entry of ``disagg sim``: parse, build the engine, serve HTTP, shut down cleanly."""

from __future__ import annotations

import asyncio
import signal
import sys

from .. import logs
from .config import SimConfig, parse
from .group import serve_in_group

log = logs.get("disagg.sim")


async def serve(cfg: SimConfig) -> int:
    from aiohttp import web

    from .clock import SimClock
    from .engine import Engine, StartupError
    from .metrics import Registry
    from .server import build_app

    clock, shared = SimClock(cfg.time_scale), Registry()
    engines: list[Engine] = []
    try:
        for rank in range(cfg.dp):  # vLLM: one engine core per data-parallel rank behind one API server
            engines.append(Engine(cfg, dp_rank=rank, clock=clock, shared=shared))
            await engines[-1].start()
    except StartupError as e:
        log.error("startup_failed", error=str(e))
        for e2 in engines:
            await e2.stop()
        return 1
    engine = engines[0]
    p = engine.perf
    log.info("engine_ready", model=cfg.model, served_model_name=cfg.served_model_names,
             model_preset=cfg.model_preset.name, model_preset_inferred=cfg.model_preset_inferred, gpu=cfg.gpu.name,
             tp=cfg.tp, pp=cfg.pp, num_gpu_blocks=engine.num_blocks, kv_cache_tokens=engine.num_blocks * cfg.block_size,
             weight_gib_per_gpu=round(p.weight_bytes_per_gpu / 2**30, 2), max_model_len=cfg.max_model_len,
             max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
             chunked_prefill=cfg.chunked_prefill, prefix_caching=cfg.prefix_caching, time_scale=cfg.time_scale,
             data_parallel_size=cfg.dp, kv_role=cfg.kv_transfer.role if cfg.kv_transfer else None,
             engine_ids=[e.engine_id for e in engines] if cfg.kv_transfer else None,
             side_channels=[f"{cfg.side_channel_host}:{e.side_port}" for e in engines] if cfg.kv_transfer else None,
             transport=cfg.transport.name, vllm_version=cfg.vllm_version)
    if cfg.load_seconds:
        await engine.clock.sleep(cfg.load_seconds)
    app = build_app(cfg, engines)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True,
                           shutdown_timeout=max(cfg.shutdown_timeout, 0.1))
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        log.error("startup_failed", error=f"cannot listen on {cfg.host or '*'}:{cfg.port} (--host/--port): {e}")
        for eng in engines:
            await eng.stop()
        return 1
    log.info("serving", host=cfg.host or "*", port=cfg.port)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting_down", shutdown_timeout=cfg.shutdown_timeout, in_flight=any(e.busy for e in engines))
    if cfg.shutdown_timeout > 0:
        deadline = loop.time() + cfg.shutdown_timeout
        while any(e.busy for e in engines) and loop.time() < deadline:
            await asyncio.sleep(0.05)
    await runner.cleanup()
    for eng in engines:
        await eng.stop()
    return 0


def run(argv: list[str]) -> int:
    cfg = parse(argv)
    logs.configure()
    for flag in cfg.ignored_flags:
        log.warning("ignored_vllm_flag", flag=flag, note="accepted for compatibility; the simulator does not model it")
    if not cfg.model_preset_inferred and not any(a.startswith("--model-preset") for a in argv):
        log.warning("model_preset_defaulted", model=cfg.model, model_preset=cfg.model_preset.name,
                    note="set --model-preset (or DISAGG_SIM_MODEL_PRESET) to choose the shapes")
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    try:
        return asyncio.run(serve_in_group(argv, cfg, serve))  # one node, or a multi-node group's leader/worker
    except KeyboardInterrupt:  # pragma: no cover
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(sys.argv[1:]))
