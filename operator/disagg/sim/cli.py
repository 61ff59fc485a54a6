"""``disagg sim``: the simulated vLLM worker. Takes ``vllm serve``'s command line (see disagg.sim.config)."""

from __future__ import annotations

import argparse

HELP = "the simulator: a simulated vLLM worker; takes `vllm serve`'s arguments, plus --gpu, --time-scale, --fault-*"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    # Every argument goes to our own vLLM-compatible parser: a prefix char no flag uses makes argparse hand
    # over `--port 8000 -tp 2 ...` untouched.
    p = subparsers.add_parser("sim", help=HELP, description=HELP, add_help=False, prefix_chars="\x01")
    p.add_argument("argv", nargs="*")
    p.set_defaults(func=_cmd_sim)


def _cmd_sim(args: argparse.Namespace) -> int:
    from .main import run

    return run(list(args.argv))
