"""Name -> world class: the one place that knows which worlds exist."""

from __future__ import annotations

from envace.envs.bank import BankWorld
from envace.envs.calendar import CalendarWorld
from envace.envs.shop import ShopWorld
from envace.envs.world import World

WORLDS: dict[str, type[World]] = {w.name: w for w in (ShopWorld, CalendarWorld, BankWorld)}


def world_names() -> list[str]:
    return list(WORLDS)


def world_class(name: str) -> type[World]:
    try:
        return WORLDS[name]
    except KeyError:
        raise ValueError(f"Unknown world {name!r}; known worlds: {', '.join(WORLDS)}") from None


def make_world(name: str, seed: int) -> World:
    return world_class(name)(seed)
