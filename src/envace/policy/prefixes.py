"""Shared prompt prefixes: plan which rows of a batch share a prefix, and build the two forwards
(prefix once, then each row's own tokens on its key/value cache). Used by generation (the
transformers backend's two-phase prefill) and by the loss (``train.forward``: a micro-batch's
shared prompt runs once)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, side: str = "left") -> tuple[torch.Tensor, torch.Tensor]:
    """[N, W] token ids and attention mask. ``left``: each row right-aligned (its next token is
    last, for generation); ``right``: left-aligned (for scoring)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
            ids[i, span] = torch.tensor(row, dtype=torch.long)
            mask[i, span] = 1
    return ids, mask


@dataclass(frozen=True)
class PrefixPlan:
    """How a batch's prompts share prefixes: ``group_of[row]`` is the row's group,
    ``prefix_len[g]`` the tokens group ``g`` shares (each row keeps at least one token of its
    own, whose logits start the generation), ``firsts[g]`` a row of the group."""

    group_of: list[int]
    prefix_len: list[int]
    firsts: list[int]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def plan_shared_prefixes(
    prompts: Sequence[Sequence[int]], min_saving: float = 0.2, limits: Sequence[int] | None = None
) -> PrefixPlan | None:
    """Group prompts by shared prefix when that cuts the prefill's padded token count by at
    least ``min_saving``; None: one ordinary padded prefill is as cheap.

    ``limits[i]``: the most tokens row i may put in a shared prefix (default ``len - 1``: the
    last token, whose logits start generation, stays in phase 2; training passes the first
    position whose hidden state it scores).

    Prompts sorted lexicographically put shared prefixes next to each other; cutting that order
    wherever two neighbours share fewer than T tokens gives groups whose prefix is the smallest
    neighbour overlap inside. Every T among the neighbour overlaps is tried and the cheapest
    kept, by padded tokens: groups x longest prefix (phase 1) + rows x longest suffix (phase 2),
    against rows x longest prompt. A group of one puts all but its last token in phase 1.
    """
    n = len(prompts)
    lens = [len(p) for p in prompts]
    cap = [min(c, n_tok - 1) for c, n_tok in zip(limits, lens)] if limits is not None else [k - 1 for k in lens]
    if n < 2 or min(cap) < 1:  # a phase-1 row needs at least one token
        return None
    order = sorted(range(n), key=lambda i: list(prompts[i]))
    # Overlap of sorted neighbours, leaving each row at least one token of its own.
    overlap = [min(_common_prefix(prompts[a], prompts[b]), cap[a], cap[b]) for a, b in zip(order, order[1:])]
    baseline = n * max(lens)
    best: tuple[int, list[list[int]], list[int]] | None = None
    for threshold in sorted({t for t in overlap if t > 0}):
        groups: list[list[int]] = [[order[0]]]
        shared: list[int] = []
        run_min: int | None = None
        for k, row in enumerate(order[1:]):
            if overlap[k] >= threshold:
                groups[-1].append(row)
                run_min = overlap[k] if run_min is None else min(run_min, overlap[k])
            else:
                shared.append(cap[groups[-1][0]] if run_min is None else run_min)
                groups.append([row])
                run_min = None
        shared.append(cap[groups[-1][0]] if run_min is None else run_min)
        row_prefix = {row: p for g, p in zip(groups, shared) for row in g}
        cost = len(groups) * max(shared) + n * max(lens[r] - row_prefix[r] for r in range(n))
        if best is None or cost < best[0]:
            best = (cost, groups, shared)
    if best is None or best[0] > (1.0 - min_saving) * baseline:
        return None
    _, groups, shared = best
    group_of = [0] * n
    for g, rows in enumerate(groups):
        for row in rows:
            group_of[row] = g
    return PrefixPlan(group_of=group_of, prefix_len=shared, firsts=[rows[0] for rows in groups])


@dataclass(frozen=True)
class PrefixInputs:
    """The two forwards of a shared-prefix pass (see :func:`prefix_inputs`)."""

    head_ids: torch.Tensor  # [groups, H] each group's shared prefix
    head_mask: torch.Tensor
    head_pos: torch.Tensor
    group: torch.Tensor  # [rows] the group of each row: copies the prefix cache out to the rows
    offset: torch.Tensor  # [rows] absolute position of each row's first own token
    tail_ids: torch.Tensor  # [rows, T] each row's own tokens
    tail_pos: torch.Tensor
    attention: torch.Tensor  # [rows, H + T] mask over the copied prefix cache and the tail


def prefix_inputs(rows: Sequence[Sequence[int]], plan: PrefixPlan, pad_id: int, side: str) -> PrefixInputs:
    """Inputs of a shared-prefix pass, for generation (``side="left"``: each row's last token is
    in the last column) and for scoring (``"right"``: the rows' tokens start in column 0).
    Tokens keep the positions they have in the full row; padding is masked, so its position
    and id never matter."""
    heads = [rows[first][:length] for first, length in zip(plan.firsts, plan.prefix_len)]
    head_ids, head_mask = pad_rows(heads, pad_id, side)
    group = torch.tensor(plan.group_of, dtype=torch.long)
    offset = torch.tensor([plan.prefix_len[g] for g in plan.group_of], dtype=torch.long)
    tail_ids, tail_mask = pad_rows([r[k:] for r, k in zip(rows, offset.tolist())], pad_id, side)
    return PrefixInputs(head_ids=head_ids, head_mask=head_mask, head_pos=(head_mask.cumsum(-1) - 1).clamp(min=0),
                        group=group, offset=offset, tail_ids=tail_ids,
                        tail_pos=offset[:, None] + (tail_mask.cumsum(-1) - 1).clamp(min=0),
                        attention=torch.cat([head_mask[group], tail_mask], dim=-1))
