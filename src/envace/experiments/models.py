"""The models a training run holds: the policy (with LoRA), per-mode copies, a frozen start copy."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from torch import nn

from envace.experiments.config import LoraConfig
from envace.policy.loading import load_model, quiet_peft
from envace.train.modes import ModeSpec


def with_lora(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    from peft import LoraConfig as PeftLoraConfig, PeftModel, get_peft_model  # seconds to import: only with LoRA

    if isinstance(model, PeftModel):
        return _continue_adapter(model, cfg)
    if not cfg.enabled:
        return model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in cfg.target_modules if t in present]
    if not targets:
        raise ValueError(f"lora.target_modules {cfg.target_modules} match no module of the model")
    peft_cfg = PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                              task_type="CAUSAL_LM")
    with quiet_peft():
        return get_peft_model(model, peft_cfg)


def _continue_adapter(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """A model loaded from a LoRA adapter directory trains that adapter on (a second adapter on top
    would be saved apart from the first and the first would stay frozen: peft stacks them)."""
    name = model.active_adapter
    loaded = model.peft_config[name]
    if not cfg.enabled:
        raise ValueError("lora.enabled is false, but the model is a LoRA adapter, which trains on as that adapter: "
                         f"set lora.enabled: true (with lora.r: {loaded.r}, lora.alpha: {loaded.lora_alpha})")
    if (loaded.r, loaded.lora_alpha) != (cfg.r, cfg.alpha):
        raise ValueError(f"lora: the model is a LoRA adapter with r={loaded.r}, alpha={loaded.lora_alpha}; training "
                         f"goes on in that adapter, so set lora.r: {loaded.r} and lora.alpha: {loaded.lora_alpha} "
                         f"(the config says r={cfg.r}, alpha={cfg.alpha})")
    loaded.inference_mode = False
    for pname, p in model.named_parameters():
        if f".{name}." in pname and "lora_" in pname:
            p.requires_grad_(True)
    return model


def _freeze(model: nn.Module) -> nn.Module:
    model.requires_grad_(False)
    model.eval()
    return model


def frozen_copy(model: nn.Module) -> nn.Module:
    return _freeze(copy.deepcopy(model))


@dataclass
class RunModels:
    tokenizer: object
    trained: dict[str, nn.Module]  # mode model key -> module (what gets optimisers and checkpoints)
    spec: ModeSpec
    extra: dict[str, nn.Module] = field(default_factory=dict)  # frozen models keyed by mode key

    def for_role(self, role: str) -> nn.Module:
        key = self.spec.role_models[role]
        return self.trained.get(key) or self.extra[key]

    @property
    def all(self) -> dict[str, nn.Module]:
        return {**self.extra, **self.trained}


def load_policy(spec: str, lora: LoraConfig) -> tuple[nn.Module, object]:
    model, tok = load_model(spec)
    return with_lora(model, lora), tok


def load_frozen(spec: str) -> nn.Module:
    """A model that only generates (a frozen simulator): a LoRA adapter directory loads merged into
    its base (nothing trains it, and every rollout generates with it), without ``with_lora``'s checks."""
    return _freeze(load_model(spec, merge_lora=True)[0])


def split_for_mode(policy: nn.Module, tokenizer: object, mode: str) -> RunModels:
    """``share``/``frozen_caller`` use the policy for both roles; the two-model modes start both
    models from the same (warm-started) policy, and ``caller_only`` freezes the simulator."""
    spec = ModeSpec.for_mode(mode)
    if spec.shared_parameters:
        return RunModels(tokenizer=tokenizer, trained={"policy": policy}, spec=spec)
    sim = copy.deepcopy(policy)
    if "simulator" in spec.trained_models:
        return RunModels(tokenizer=tokenizer, trained={"caller": policy, "simulator": sim}, spec=spec)
    sim.requires_grad_(False)
    return RunModels(tokenizer=tokenizer, trained={"caller": policy}, spec=spec, extra={"simulator": sim})
