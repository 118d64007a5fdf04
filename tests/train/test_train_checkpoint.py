"""Checkpoints: round trip, exact resume, keep-last, atomicity, peft adapters, several models."""

from __future__ import annotations

import json
import random

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from train_helpers import make_tiny_model, random_scored_batch
from transformers import LlamaForCausalLM

from envace.train.checkpoint import (
    LATEST_FILE,
    STATE_FILE,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from envace.train.step import GRPOUpdater, UpdaterConfig


def _assert_same_params(a: torch.nn.Module, b: torch.nn.Module, atol: float = 0.0) -> None:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for n in pa:
        torch.testing.assert_close(pa[n], pb[n], atol=atol, rtol=0.0, msg=n)


def _train_step(updater: GRPOUpdater, model: torch.nn.Module) -> dict[str, float]:
    """A step whose batch depends on the global RNGs, so a resume must restore them."""
    seed = random.randrange(10**6) + int(torch.randint(0, 10**6, ()).item())
    return updater.step(random_scored_batch(model, 6, seed=seed))


def test_round_trip_restores_model_optimizer_and_state(tmp_path):
    model = make_tiny_model(0)
    updater = GRPOUpdater(model, UpdaterConfig(lr=1e-3))
    _train_step(updater, model)
    path = save_checkpoint(tmp_path, model, updater.optimizer, step=1, extra={"epoch": 0, "note": "x"})
    assert path.name == "step-00000001" and find_latest(tmp_path) == path
    assert (tmp_path / LATEST_FILE).read_text().strip() == path.name

    fresh = make_tiny_model(99)
    fresh_updater = GRPOUpdater(fresh, UpdaterConfig(lr=1e-3))
    loaded = load_checkpoint(tmp_path, fresh, fresh_updater.optimizer)
    assert loaded.step == 1 and loaded.extra == {"epoch": 0, "note": "x"} and loaded.path == path
    _assert_same_params(model, fresh)
    sa, sb = updater.optimizer.state_dict(), fresh_updater.optimizer.state_dict()
    for k in sa["state"]:
        torch.testing.assert_close(sa["state"][k]["exp_avg"], sb["state"][k]["exp_avg"])
    # The checkpoint directory is a Hugging Face model directory.
    _assert_same_params(model, LlamaForCausalLM.from_pretrained(path))


def test_resume_reproduces_the_next_step(tmp_path):
    torch.manual_seed(0)
    random.seed(0)
    model = make_tiny_model(0)
    updater = GRPOUpdater(model, UpdaterConfig(lr=1e-3))
    for _ in range(2):
        _train_step(updater, model)
    save_checkpoint(tmp_path, model, updater.optimizer, step=2)
    _train_step(updater, model)  # step 3 of the uninterrupted run

    resumed = make_tiny_model(7)
    resumed_updater = GRPOUpdater(resumed, UpdaterConfig(lr=1e-3))
    random.seed(123)  # clobber the RNGs: the checkpoint must bring them back
    torch.manual_seed(123)
    assert load_checkpoint(tmp_path, resumed, resumed_updater.optimizer).step == 2
    _train_step(resumed_updater, resumed)  # step 3 again
    _assert_same_params(model, resumed, atol=1e-7)

    # Sanity: without the RNG states the next step's batch differs, and so do the weights.
    no_rng = make_tiny_model(7)
    no_rng_updater = GRPOUpdater(no_rng, UpdaterConfig(lr=1e-3))
    load_checkpoint(tmp_path, no_rng, no_rng_updater.optimizer, restore_rng=False)
    _train_step(no_rng_updater, no_rng)
    assert any(not torch.allclose(p, q) for p, q in zip(model.parameters(), no_rng.parameters()))


def test_tied_embeddings_round_trip(tmp_path):
    """SmolLM2 ties lm_head to the embeddings; save_pretrained stores the tensor once."""
    from transformers import LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                      intermediate_size=64, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg)
    path = save_checkpoint(tmp_path, model, step=1)
    torch.manual_seed(1)
    fresh = LlamaForCausalLM(cfg)
    load_checkpoint(path, fresh)
    _assert_same_params(model, fresh)
    assert fresh.lm_head.weight.data_ptr() == fresh.model.embed_tokens.weight.data_ptr()


def test_keep_last_and_latest(tmp_path):
    model = make_tiny_model(0)
    for step in range(1, 6):
        save_checkpoint(tmp_path, model, step=step, keep_last=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5]
    assert find_latest(tmp_path).name == "step-00000005"
    # Re-saving an existing step replaces it whole.
    save_checkpoint(tmp_path, model, step=5, keep_last=2, extra={"again": True})
    assert json.loads((tmp_path / "step-00000005" / STATE_FILE).read_text())["extra"] == {"again": True}
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5]


def test_partial_checkpoints_are_ignored(tmp_path):
    model = make_tiny_model(0)
    good = save_checkpoint(tmp_path, model, step=3)
    # A run killed mid-save leaves a temp dir; a copied dir without its state file is incomplete.
    killed = tmp_path / ".tmp-step-00000004-deadbeef"
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"half a file")
    incomplete = tmp_path / "step-00000005"
    incomplete.mkdir()
    (incomplete / "config.json").write_text("{}")
    (tmp_path / LATEST_FILE).write_text("step-00000005\n")  # pointer to the broken one
    assert find_latest(tmp_path) == good
    assert load_checkpoint(tmp_path, make_tiny_model(1)).step == 3
    # The next save clears the stale temp dir.
    save_checkpoint(tmp_path, model, step=6)
    assert not killed.exists() and find_latest(tmp_path).name == "step-00000006"
    assert find_latest(tmp_path / "nowhere") is None
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "nowhere", model)


def test_failed_save_leaves_nothing(tmp_path):
    model = make_tiny_model(0)
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, model, step=1, extra={"bad": object()})

    class Exploding(torch.nn.Module):
        def save_pretrained(self, *args, **kwargs):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(tmp_path, Exploding(), step=2)
    assert list(tmp_path.iterdir()) == [] and find_latest(tmp_path) is None


def test_peft_adapter_checkpoint(tmp_path):
    def lora_model(seed: int) -> PeftModel:
        base = make_tiny_model(0)  # same base weights; the adapter differs
        torch.manual_seed(seed)
        return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))

    model = lora_model(1)
    updater = GRPOUpdater(model, UpdaterConfig(lr=1e-2))
    updater.step(random_scored_batch(model, 4, seed=3))
    path = save_checkpoint(tmp_path, model, updater.optimizer, step=1)
    assert (path / "adapter_model.safetensors").exists() and (path / "adapter_config.json").exists()
    assert not (path / "model.safetensors").exists()

    other = lora_model(2)
    other_updater = GRPOUpdater(other, UpdaterConfig(lr=1e-2))
    load_checkpoint(path, other, other_updater.optimizer)
    _assert_same_params(model, other)
    # And peft can load it as an adapter dir.
    _assert_same_params(model, PeftModel.from_pretrained(make_tiny_model(0), path))


def test_several_models(tmp_path):
    models = {"caller": make_tiny_model(0), "simulator": make_tiny_model(1)}
    updaters = {k: GRPOUpdater(m, UpdaterConfig(lr=1e-3)) for k, m in models.items()}
    path = save_checkpoint(tmp_path, models, {k: u.optimizer for k, u in updaters.items()}, step=4)
    assert (path / "caller" / "config.json").exists() and (path / "optimizer-simulator.pt").exists()
    fresh = {"caller": make_tiny_model(5), "simulator": make_tiny_model(6)}
    load_checkpoint(path, fresh)
    for k in models:
        _assert_same_params(models[k], fresh[k])
    with pytest.raises(ValueError, match="policy"):
        load_checkpoint(path, {"policy": make_tiny_model(0)})


def test_an_adapter_of_an_aliased_base_model_saves_without_a_warning(tmp_path):
    """A LoRA model on a base named by an envace alias ("smollm2", no config on disk or reachable
    hub): peft would look it up at every save and warn; an adapter that touches no embedding
    saves without it, and loads back the same."""
    import warnings

    base = make_tiny_model(0)
    base.name_or_path = "smollm2"  # what peft takes as the base model's name
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], lora_dropout=0.0))
    assert model.peft_config["default"].base_model_name_or_path == "smollm2"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = save_checkpoint(tmp_path, model, step=1)
    assert not [w for w in caught if "config file" in str(w.message)], [str(w.message) for w in caught]
    other = get_peft_model(make_tiny_model(0), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"],
                                                          lora_dropout=0.0))
    load_checkpoint(path, other)
    _assert_same_params(model, other)
