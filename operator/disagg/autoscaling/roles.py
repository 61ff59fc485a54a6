"""Role moves before pods (issue 28): lend ready workers of one pool to the other role. PURE.

A change in the mix (more long prompts, or more streams) makes one pool short while the other has ready workers it
does not need. A pod takes ``podStartSeconds`` to serve (53 s for an 8B model without a compile cache); a role
move takes one router config reload: the router sends the lent workers the other role's work
(router/load.py ``WorkerSet.lend``), and what they hold finishes where it is. Pod counts still follow the need at
their own pace (predictive.py); once the short pool's own pods are ready the lend returns.

Only compatible pools lend (the same engine build and KV layout: the compat hash that pairs prefill and decode
workers), and a pool lends only what it does not need itself at the same load, never its last worker.
"""

from __future__ import annotations

from ..api.status import RoleMoves


def plan_moves(need_prefill: int, need_decode: int, ready_prefill: int, ready_decode: int) -> RoleMoves:
    """The workers to lend for a load that needs ``need_*`` replicas per role, with ``ready_*`` ready in each pool:
    the short role borrows from the other pool's spare (its ready workers beyond its own need), no more than it is
    short, and a pool keeps one worker of its own at least. Both short, or neither: no move."""
    short_d, spare_p = need_decode - ready_decode, min(ready_prefill - need_prefill, ready_prefill - 1)
    short_p, spare_d = need_prefill - ready_prefill, min(ready_decode - need_decode, ready_decode - 1)
    if short_d > 0 and spare_p > 0:
        n = min(short_d, spare_p)
        return RoleMoves(prefill_to_decode=n, reason=f"decode needs {need_decode} and has {ready_decode} ready; "
                                                     f"prefill needs {need_prefill} of its {ready_prefill}: {n} lent "
                                                     f"to decode")
    if short_p > 0 and spare_d > 0:
        n = min(short_p, spare_d)
        return RoleMoves(decode_to_prefill=n, reason=f"prefill needs {need_prefill} and has {ready_prefill} ready; "
                                                     f"decode needs {need_decode} of its {ready_decode}: {n} lent to "
                                                     f"prefill")
    return RoleMoves()
