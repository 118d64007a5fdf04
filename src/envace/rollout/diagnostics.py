"""What the token caps did to a batch of episodes: per role, the turns cut off at
``max_new_tokens``, and of those the ones stuck repeating themselves (a decoding loop). A cut-off
tool call does not parse and a cut-off rehearsed response is not JSON, so these say whether the
cap, not the policy, decides episodes, and which remedy applies."""

from __future__ import annotations

from dataclasses import dataclass

from envace.core.types import Trajectory

# Tokens a cut-off turn's tail must repeat to count as a loop: longer than the keys between two
# values of a JSON list item, so a long but varied result does not count.
LOOP_SPAN = 24


@dataclass
class Truncation:
    """One role's turns: how many stopped at the token cap, how many of those were stuck
    repeating themselves (a decoding loop), and how many there were."""

    cut: int = 0
    looped: int = 0
    turns: int = 0


def ends_in_loop(ids: list[int], span: int = LOOP_SPAN) -> bool:
    """Whether the last ``span`` tokens already occur earlier in ``ids``: a turn cut off while
    repeating itself (greedy decoding of a small model does this). A longer cap only repeats
    more, so telling it apart from a turn that is merely long says which remedy applies."""
    if len(ids) < 2 * span:
        return False
    tail = ids[-span:]
    return any(ids[i:i + span] == tail for i in range(len(ids) - span))


def truncation_counts(trajectories: list[Trajectory]) -> dict[str, Truncation]:
    """Per role, the turns that stopped at the token cap instead of ending: a cut-off tool call
    does not parse and a cut-off rehearsed response is not JSON, so a high share means the cap
    (or a decoding loop), not what the model meant, is failing the episodes."""
    counts: dict[str, Truncation] = {}
    for traj in trajectories:
        for s in traj.samples:
            c = counts.setdefault(s.role, Truncation())
            cut = s.finish == "length"
            c.cut += cut
            c.looped += cut and ends_in_loop(s.gen_ids)
            c.turns += 1
    return dict(sorted(counts.items()))


def truncated_fractions(trajectories: list[Trajectory]) -> dict[str, float]:
    """``truncated/<role>``: the share of the role's turns cut off at the cap."""
    return {f"truncated/{role}": c.cut / c.turns for role, c in truncation_counts(trajectories).items()}
