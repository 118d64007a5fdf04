"""Training modes: which model generates each role, and which roles' samples train which model.

=============  ======================  ==========================================================
mode           models                  what learns
=============  ======================  ==========================================================
share          policy (both roles)     policy, on caller + simulator samples
noshare        caller, simulator       caller model on caller samples; simulator model on its own
caller_only    caller, simulator       caller model on caller samples; simulator model frozen
frozen_caller  policy (both roles)     policy, on simulator samples only (caller loss weight 0:
                                       the shared parameters still move, through the simulator)
=============  ======================  ==========================================================

``caller_only`` keeps a separate simulator model because a frozen simulator cannot share
parameters with a learning caller. (Share mode with ``simulator_weight=0`` is the other variant:
the caller learns and the simulator drifts with it.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from envace.core.types import Role
from envace.train.advantages import ScoredSample

ModeName = Literal["share", "noshare", "caller_only", "frozen_caller"]
MODE_NAMES: tuple[str, ...] = get_args(ModeName)
SHARED_MODEL = "policy"


@dataclass(frozen=True)
class ModeSpec:
    name: ModeName
    role_models: Mapping[Role, str]  # role -> key of the model that generates (and may learn) it
    trained_roles: frozenset[Role]  # roles whose samples carry loss

    @classmethod
    def for_mode(cls, name: str) -> ModeSpec:
        shared: dict[Role, str] = {"caller": SHARED_MODEL, "simulator": SHARED_MODEL}
        separate: dict[Role, str] = {"caller": "caller", "simulator": "simulator"}
        table: dict[str, tuple[dict[Role, str], frozenset[Role]]] = {
            "share": (shared, frozenset({"caller", "simulator"})),
            "noshare": (separate, frozenset({"caller", "simulator"})),
            "caller_only": (separate, frozenset({"caller"})),
            "frozen_caller": (shared, frozenset({"simulator"})),
        }
        if name not in table:
            raise ValueError(f"unknown training mode {name!r}; expected one of {', '.join(MODE_NAMES)}")
        role_models, trained = table[name]
        return cls(name=name, role_models=role_models, trained_roles=trained)  # type: ignore[arg-type]

    @property
    def shared_parameters(self) -> bool:
        return len(set(self.role_models.values())) == 1

    @property
    def model_keys(self) -> tuple[str, ...]:
        """Every model the mode needs at rollout time (sorted, no duplicates)."""
        return tuple(sorted(set(self.role_models.values())))

    @property
    def trained_models(self) -> tuple[str, ...]:
        """Models that get an optimiser (others are frozen: never stepped)."""
        return tuple(sorted({self.role_models[r] for r in self.trained_roles}))

    def roles_trained_by(self, model_key: str) -> frozenset[Role]:
        return frozenset(r for r in self.trained_roles if self.role_models[r] == model_key)

    def loss_weights(
        self, model_key: str, caller_weight: float = 1.0, simulator_weight: float = 1.0
    ) -> dict[Role, float]:
        """Per-role loss weights for ``model_key``'s updater: the configured weight for a role
        this model trains, 0 for every other role."""
        base: dict[Role, float] = {"caller": caller_weight, "simulator": simulator_weight}
        trained = self.roles_trained_by(model_key)
        return {r: (w if r in trained else 0.0) for r, w in base.items()}

    def split_by_model(self, scored: Sequence[ScoredSample]) -> dict[str, list[ScoredSample]]:
        """The samples each trained model learns from (frozen roles' samples are dropped)."""
        out: dict[str, list[ScoredSample]] = {k: [] for k in self.trained_models}
        for s in scored:
            if s.role in self.trained_roles:
                out[self.role_models[s.role]].append(s)
        return out
