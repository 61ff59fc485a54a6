"""Installed into the real-engine tier's venv by hack/vllm-cpu-venv.sh (not part of the disagg package).

NIXL 1.5.1's progress thread busy-polls: every idle engine burns 0.6-0.7 of a core, which a 2-core CI machine
cannot spare for two engines. With DISAGG_NIXL_PROGRESS_THREAD=0 (the local runtime sets it for real engines)
agents are created with the thread off; vLLM's NixlConnector drives progress itself when it checks transfers
(transfers, notifications and block freeing were seen to work so on 2026-12-01). nixl_agent_config's signature:
nixl_cu13/_api.py (nixl-cu13 1.5.1), ``enable_prog_thread: bool = True`` first.
"""

import os

if os.environ.get("DISAGG_NIXL_PROGRESS_THREAD") == "0":
    try:
        import nixl_cu13._api as _nixl_api
    except ImportError:  # no NIXL in this venv: nothing to turn off
        pass
    else:
        _defaults = _nixl_api.nixl_agent_config.__init__.__defaults__ or ()
        if _defaults and _defaults[0] is True:
            _nixl_api.nixl_agent_config.__init__.__defaults__ = (False, *_defaults[1:])
