"""Error probes: real calls with one id argument replaced by an id the world does not have.

The oracle never errs, so its trajectories show a world model only successes. A probe takes a
call of a real trajectory, swaps its first id argument (``id`` or ``*_id``) for a missing one and
asks a fresh world of the task, replayed through the earlier calls, what it answers: the real
error at exactly that point. The fidelity eval measures a world model on them; the SFT warm start
can teach from them (``sft.error_probes``).

Two kinds of missing id: ``obvious`` (``p-99999``, what the fidelity eval uses) and, given an
``rng``, ``plausible`` ones (same prefix and digit count as the real id, drawn until the world
rejects one), so that a model taught on probes cannot pass the eval's by spotting ``99999``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from envace.core.errors import is_error
from envace.core.types import Task, ToolCall
from envace.core.validate import validate_call
from envace.envs.registry import make_world, world_names

_ID_VALUE = re.compile(r"^([A-Za-z]+)-(\d+)$")
PLAUSIBLE_TRIES = 20  # draws per probe before giving up on a plausible missing id


@dataclass(frozen=True)
class Probe:
    position: int  # index of the replaced call in the trajectory's calls
    call: ToolCall  # the call with the missing id
    result: Any  # what the real world answered (an error, checked)


def obvious_missing_id(value: str) -> str:
    m = _ID_VALUE.match(value)
    return f"{m.group(1)}-99999" if m else value + "-x9"


def _plausible_ids(value: str, rng: random.Random) -> list[str]:
    m = _ID_VALUE.match(value)
    if not m:
        return [value + "-x" + str(rng.randrange(10, 100)) for _ in range(PLAUSIBLE_TRIES)]
    prefix, digits = m.group(1), len(m.group(2))
    lo = 10 ** (digits - 1) if digits > 1 else 0
    return [f"{prefix}-{rng.randrange(lo, 10 ** digits)}" for _ in range(PLAUSIBLE_TRIES)]


def error_probes(task: Task, calls: Sequence[ToolCall], max_probes: int = 1,
                 rng: random.Random | None = None) -> list[Probe]:
    """Up to ``max_probes`` probes of one trajectory's ``calls`` (in order), for tasks whose real
    world is an embedded one (a user's world may have side effects: it is never replayed here).
    ``rng`` None: obvious missing ids; else plausible ones. A probe the tool schema rejects, or
    that the world answers without an error, is skipped."""
    if task.env is None or task.env.world not in world_names() or max_probes <= 0:
        return []
    out: list[Probe] = []
    for i, call in enumerate(calls):
        if len(out) >= max_probes:
            break
        keys = [k for k, v in call.arguments.items() if isinstance(v, str) and (k == "id" or k.endswith("_id"))]
        if not keys:
            continue
        original = call.arguments[keys[0]]
        candidates = [obvious_missing_id(original)] if rng is None else _plausible_ids(original, rng)
        for missing in candidates:
            if missing == original:
                continue
            probe = ToolCall(name=call.name, arguments={**call.arguments, keys[0]: missing})
            if validate_call(probe, task.tools) is not None:
                break
            world = make_world(task.env.world, task.env.seed)
            for earlier in calls[:i]:
                world.call(earlier.name, earlier.arguments)
            result = world.call(probe.name, probe.arguments)
            if is_error(result):
                out.append(Probe(position=i, call=probe, result=result))
                break
    return out
