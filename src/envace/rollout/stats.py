"""How a batched run of episodes went (tokens and seconds per role) and how far a long one is."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields


@dataclass
class RolloutStats:
    episodes: int = 0
    caller_tokens: int = 0
    simulator_tokens: int = 0
    caller_seconds: float = 0.0
    simulator_seconds: float = 0.0
    wall_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        gen_s = self.caller_seconds + self.simulator_seconds
        return (self.caller_tokens + self.simulator_tokens) / gen_s if gen_s > 0 else 0.0

    def __add__(self, other: RolloutStats) -> RolloutStats:
        """Two batches run one after the other: counts and times add up."""
        return RolloutStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def log_turns(log: Callable[[str], None], label: str = "",
              max_turns: int | None = None) -> Callable[[int, int, int], None]:
    """An ``on_turn`` for :func:`run_episodes` that logs how far a long batched run is: on a CPU one
    turn of a few hundred episodes takes minutes, and a job that prints nothing looks hung."""
    t0 = time.perf_counter()

    def on_turn(turn: int, finished: int, total: int) -> None:
        of = f"/{max_turns}" if max_turns else ""
        log(f"{label}turn {turn}{of}: {finished}/{total} episodes finished, {time.perf_counter() - t0:.0f} s")

    return on_turn
