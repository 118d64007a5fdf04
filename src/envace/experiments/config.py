"""Training configuration: typed, loaded from YAML, overridable from the command line.

A bad value fails before anything runs, with the file and the dotted field path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from envace.core.prompts import PromptStyle
from envace.policy.allocator import DEFAULT_MMAP_THRESHOLD
from envace.rollout.engine import RolloutConfig
from envace.train.step import UpdateSettings


class _Section(BaseModel):
    # strict: `steps: true` or `lr: "1e-4"` is an error, not 1 or a silent coercion (ints still
    # pass for floats: `lr: 1` is 1.0)
    model_config = ConfigDict(extra="forbid", strict=True)


class RolloutSettings(_Section):
    """The ``rollout`` section: how training episodes are generated (lengths, sampling, engine)."""

    max_turns: int = Field(RolloutConfig.max_turns, ge=1,  # the engine's default
                           description="caller turns per episode before it is cut off")
    caller_max_new_tokens: int = Field(64, ge=1, description="longest caller turn, in new tokens")
    simulator_max_new_tokens: int = Field(64, ge=1, description="longest rehearsed tool result, in new tokens")
    max_prompt_tokens: int = Field(1536, ge=16, description="longest prompt; older turns are dropped to fit")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of training rollouts (caller role)")
    # A real API answers the same call the same way; sampling the rehearsed answer at T=1 from a
    # small model mostly adds noise to the world the caller learns in (docs/notes/2026-12-results-history.md).
    simulator_temperature: float | None = Field(None, ge=0, description="sampling temperature of the "
                                                "simulator role (0 = greedy); None: rollout.temperature")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling of rollouts (1: off)")
    max_batch: int = Field(16, ge=1, description="most prompts generated together in one batch")
    # Who generates training rollouts (policy/weight_sync.py): the trainer's model in process, an
    # OpenAI-compatible server (weights pushed to it after every update), an in-process vLLM engine,
    # or llama.cpp in process (policy/llamacpp_backend.py: the weights written as GGUF every update).
    backend: Literal["transformers", "http", "vllm", "llamacpp"] = Field(
        "transformers", description="who generates training rollouts: the trainer's model in process, an "
        "OpenAI-compatible server (http), in-process vLLM, or llama.cpp")
    llamacpp_quant: Literal["F32", "BF16", "Q8_0", "Q4_1"] = Field("Q8_0", description="backend llamacpp: the "
                                                                  "encoding of the pushed weights (quantised: "
                                                                  "faster, sampled further from the trainer's "
                                                                  "policy; see grpo.is_cap)")
    llamacpp_ctx: int = Field(8192, ge=256, description="backend llamacpp: key/value cells shared by the rows "
                              "decoded together (rows are grouped so their prompts plus new tokens fit)")
    server_url: str | None = Field(None, description="backend http: the server of the caller (and, in share "
                                   "mode, simulator) role, e.g. http://127.0.0.1:8000/v1")
    simulator_url: str | None = Field(None, description="the simulator role's server: noshare's trained "
                                      "simulator, or caller_only's / source simulator's external frozen one")
    server_batches: bool = Field(True, description="send a turn's prompts in one request (envace serve seeds "
                                 "rows by index); false for vLLM/SGLang servers: one request per prompt, each "
                                 "with its own seed")
    recompute_logprobs: bool | None = Field(None, description="score the rollouts' tokens with the trainer's "
                                            "model before the update; None: on for http and vllm backends, "
                                            "and when rollout.dtype differs from the trainer's. With grpo.ppo_epochs 1 the "
                                            "update's own forward does it (no separate pass)")
    kv_reuse_tokens: int = Field(0, ge=0, description="backend transformers: keep up to this many tokens of "
                                 "finished rows' key/value caches between generate calls, so an episode's "
                                 "later turn prefills only its new tokens (policy/kv_reuse.py); 0: off")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="backend transformers: generate "
                                                  "rollouts and evals with a copy of the policy in this dtype "
                                                  "(bfloat16: faster on CPUs with AVX512-BF16 and on GPUs); the "
                                                  "trainer keeps its own weights and recomputes the log-probs")
    examples_as_recorded: bool = Field(True, description="a rehearsed call that matches one of the task's "
                                       "recorded examples (same tool, same arguments after JSON normalisation) is "
                                       "answered with the recorded result, not generated")
    progress_weight: float = Field(0.0, ge=0, le=1, description="training reward only: an unsolved episode of a "
                                   "task with a reference earns this share of its in-order progress along the "
                                   "reference's calls (r + w (1 - r) p); full marks still need every checklist "
                                   "item, and evals never count it. 0: off")
    truncation_warnings: bool = Field(True, description="say once per role when more than 10% of its turns "
                                      "(or of the warm start's turns) stop at the token cap (off for runs not meant to learn, such as "
                                      "configs/smoke.yaml; the eval table's truncated/* rows still count them)")
    example_reward: bool = Field(False, description="rehearse-role samples of calls that match a recorded "
                                 "example are rewarded by how well they reproduce the recorded result (0..1, "
                                 "centred in a pool of their own) instead of by the trajectory's reward")

    @property
    def recomputes_logprobs(self) -> bool:
        """Whether the trainer scores the rollouts' tokens itself: asked for, or the rollouts come
        from another engine (http, vllm) or another dtype than the trainer's fp32 weights."""
        if self.recompute_logprobs is not None:
            return self.recompute_logprobs
        return self.backend != "transformers" or self.dtype != "float32"

    def episodes(self, group_size: int) -> RolloutConfig:
        """The episode engine's settings for ``group_size`` episodes per task under this section."""
        return RolloutConfig(group_size=group_size, max_turns=self.max_turns, progress_weight=self.progress_weight)

    def generation(self, style: PromptStyle, temperature: float | None = None) -> GenerationSettings:
        """This section's generation settings with the prompt ``style``; ``temperature``: both
        roles' (an eval's), instead of rollout.temperature / simulator_temperature."""
        mine = {f.name: getattr(self, f.name) for f in fields(GenerationSettings) if f.name in type(self).model_fields}
        if temperature is not None:
            mine.update(temperature=temperature, simulator_temperature=temperature)
        return GenerationSettings(**mine, style=style)


def _rollout_default(name: str) -> Any:
    return RolloutSettings.model_fields[name].default


@dataclass
class GenerationSettings:
    """What actors and rehearsing sources generate with (experiments.factory): a training run's
    rollout section and prompt style (``RolloutSettings.generation``), or another job's own values.
    Each default is the rollout section's: no setting has two."""

    caller_max_new_tokens: int = _rollout_default("caller_max_new_tokens")
    simulator_max_new_tokens: int = _rollout_default("simulator_max_new_tokens")
    max_prompt_tokens: int = _rollout_default("max_prompt_tokens")
    temperature: float = _rollout_default("temperature")
    simulator_temperature: float | None = _rollout_default("simulator_temperature")  # None: ``temperature``
    top_p: float = _rollout_default("top_p")
    max_batch: int = _rollout_default("max_batch")
    style: PromptStyle = field(default_factory=PromptStyle)
    examples_as_recorded: bool = _rollout_default("examples_as_recorded")
    example_reward: bool = _rollout_default("example_reward")


class GRPOConfig(UpdateSettings):
    """The ``grpo`` section: the update's settings (train.step.UpdateSettings, declared there once)
    plus the advantages' and the learning-rate schedule's."""

    warmup_steps: int = Field(0, ge=0, description="GRPO steps whose learning rate ramps linearly up to `lr` "
                              "(step k of n at lr*k/(n+1)): a fresh Adam moves every weight by about lr on its "
                              "first steps whatever the gradient, which can undo a warm start")
    norm_by_std: bool = Field(False, description="divide each group's centred rewards by their std (GRPO's "
                              "original advantage); false: centred only (Dr. GRPO)")
    empty_penalty: float = Field(0.1, ge=0, description="reward subtracted for an empty turn (EOS only)")
    anchor_samples: int = Field(16, ge=1, description="anchor samples per step (with anchor_coef > 0)")
    sim_format_reward: float = Field(0.0, ge=0, description="extra simulator reward when its output parses as JSON")


class LoraConfig(_Section):
    """The ``lora`` section: low-rank adapters trained instead of the full weights."""

    enabled: bool = Field(True, description="train LoRA adapters instead of every weight")
    r: int = Field(16, ge=1, description="LoRA rank")
    alpha: int = Field(32, ge=1, description="LoRA scaling numerator (scale alpha/r)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the LoRA path")
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                               "gate_proj", "up_proj", "down_proj"],
                                      description="the linear layers that get adapters")


class SFTConfig(_Section):
    """The ``sft`` section: the warm start on the scripted oracle's trajectories (and the copy warm-up)."""

    enabled: bool = Field(True, description="SFT warm start on the scripted oracle's trajectories before GRPO")
    trajectories: int = Field(200, ge=1, description="oracle trajectories from the train split")
    simulator_trajectories: int | None = Field(None, ge=0, description="of those, how many also give "
                                               "simulator samples (default: all)")
    epochs: int = Field(2, ge=1, description="passes over the warm start's samples")
    lr: float = Field(2e-4, gt=0, description="the warm start's peak learning rate")
    micro_batch_tokens: int = Field(4096, ge=64, description="most tokens in one forward pass (gradients "
                                    "accumulate up to batch_samples)")
    batch_samples: int = Field(16, ge=1, description="samples per optimiser step")
    schedule: Literal["constant", "cosine"] = Field("cosine", description="the warm start's learning-rate schedule")
    copy_warmup_steps: int = Field(0, ge=0, description="steps on repeated random spans before SFT "
                                   "(for models trained from scratch; see train/copy_warmup.py)")
    copy_warmup_lr: float = Field(1e-3, gt=0, description="the copy warm-up's learning rate")
    copy_warmup_vocab: int = Field(256, ge=2, description="the most frequent data tokens the spans are drawn from")
    copy_warmup_span: int = Field(16, ge=2, description="length of the random spans the copy warm-up repeats")
    copy_warmup_data: float = Field(0.0, ge=0, le=1, description="share of copy warm-up steps that copy windows "
                                    "of real tool results (repeated keys, as in every JSON list) instead of "
                                    "random spans")
    copy_warmup_data_span: int = Field(128, ge=2, description="longest real-result window copied")
    roles: list[Literal["caller", "simulator"]] = Field(default_factory=lambda: ["caller", "simulator"],
                                                      description="the roles the warm start trains")
    error_probes: int = Field(0, ge=0, description="per trajectory with simulator samples, up to this many more: "
                              "a call with an id the world does not have, the target its real error (the oracle "
                              "never errs; embedded worlds only)")
    example_samples: int | None = Field(None, ge=0, description="with the simulator role: up to this many of the "
                                        "train tasks' recorded examples (distinct ones, drawn by seed) also become "
                                        "simulator samples (call -> recorded result), world or not; 0: none; None: "
                                        "all of a task file's, none of the embedded worlds' (generated from the "
                                        "same states the replays show)")
    caller_repeats: int = Field(1, ge=1, le=16, description="each caller sample appears this many times an "
                                "epoch (the simulator's once): a task file's references are few beside its recorded "
                                "examples, and a caller that has not learnt the tool names gives RL nothing to start from")
    init_from: str | None = Field(None, description="reuse the warm start of an earlier run: its <run>/sft dir")
    vocab: int | None = Field(None, ge=300, description="for a llama: model trained from scratch: train a byte-level "
                              "BPE of this many tokens on the warm start's oracle text and size the model's "
                              "vocabulary to it (policy/data_tokenizer.py); None: SmolLM2's 49,152 tokens")


class EvalConfig(_Section):
    """The ``eval`` section: the real-world (or rehearsal-judged) evaluation during and after training."""

    every: int = Field(5, ge=0, description="steps between real-world evaluations (0: only at start and end)")
    at_start: bool = Field(True, description="evaluate the start model (step 0); false when another run from "
                           "the same warm start (sft.init_from) already did, e.g. comparing response sources; "
                           "with steps: 0, no eval at all (an SFT-only run)")
    tasks: int = Field(24, ge=1, description="tasks per evaluation")
    split: Literal["train", "test", "pool"] = Field(
        "test", description="test: held-out tasks; pool: the first `tasks` of the tasks GRPO trains on (with "
        "rl_pool: all of them), i.e. whether training with imagined responses carries over to the real worlds")
    temperature: float = Field(0.0, ge=0, description="sampling temperature of eval episodes (0: greedy)")
    samples: int = Field(1, ge=1, description="episodes per task; with temperature > 0 success is averaged over "
                         "them: an estimate of the sampling policy's success, far less noisy than one greedy "
                         "episode per task (a greedy eval moves in whole tasks)")
    world: str | dict[str, Any] | None = Field(
        None, description="the real environment the evals run in, when training has none (world: null, a "
        "schema-only run evaluated against the real tools) or another one; the same forms as the top-level "
        "world. None: the run's world")
    backend: Literal["auto", "rollout", "transformers"] = Field(
        "auto", description="who generates the eval episodes: rollout: the rollouts' backend, holding the weights "
        "pushed after the last update (llama.cpp: several times faster on a CPU); transformers: the trainer's model "
        "in process (the reference path); auto: rollout where rollout.backend is llamacpp, else transformers")
    rehearsal_gap: bool = Field(True, description="where the eval tasks have a real world, also run them with the "
                                "policy rehearsing the responses (judged as a rehearsal step judges) and measure "
                                "its fidelity on the real calls and the recorded examples: eval/rehearsal_success "
                                "beside eval/success")

    @model_validator(mode="after")
    def _samples_need_sampling(self) -> EvalConfig:
        if self.samples > 1 and self.temperature == 0:
            raise ValueError("eval.samples > 1 needs eval.temperature > 0: greedy episodes of one task are all the same")
        return self


class CheckpointConfig(_Section):
    """The ``checkpoint`` section: how often the run saves, and how many saves it keeps."""

    every: int = Field(1, ge=1, description="steps between checkpoints (the last step always saves one)")
    keep_last: int = Field(2, ge=1, description="checkpoints kept; older ones are deleted")


class BenchTrainConfig(_Section):
    """Train on a paper benchmark's entries instead of the embedded worlds (experiments.bench_train)."""
    name: str = Field(description="benchmark, as in `envace bench list`")
    categories: list[str] = Field(min_length=1, description="the benchmark's categories to train on")
    limit: int | None = Field(None, ge=1, description="first N entries of each category (default: all)")
    test_every: int = Field(5, ge=2, description="every N-th entry is held out for the real-environment eval")
    data_dir: str | None = Field(None, description="local copy of the benchmark's data (default: its own)")
    data_version: str | None = Field(None, description="the benchmark data's version (default: the pinned one)")
    max_steps: int | None = Field(None, ge=1, description="caller steps per user turn (default: the benchmark's)")
    max_user_turns: int = Field(30, ge=1, description="most simulated-user turns per conversation")


class JudgeConfig(_Section):
    """The LLM judge of ``judge`` checklist items, in training reward and evaluation."""
    model: str | None = Field(None, description="a local model (smollm2, tiny, a HF dir); default: the policy "
                              "when no url is given")
    url: str | None = Field(None, description="an OpenAI-compatible endpoint (…/v1), asked by chat completions")
    served_model: str | None = Field(None, description="the model name the endpoint serves (default: its first)")
    api_key_env: str = Field("ENVACE_API_KEY", description="environment variable holding the endpoint's key")
    timeout_s: float = Field(60.0, gt=0, description="seconds to wait for one judge request")
    retries: int = Field(2, ge=0, description="retries of a failed judge request")
    max_new_tokens: int = Field(24, ge=1, description="longest judge verdict, in new tokens")


class TrainConfig(_Section):
    model: str = Field("smollm2", description="the policy: smollm2, tiny, llama:HIDDENxLAYERS (from scratch) or "
                       "a local HF model dir")
    sim_model: str | None = Field(None, description="frozen simulator for source=simulator (default: the start model)")
    seed: int = Field(0, description="seeds task sampling, rollouts and the warm start's data")
    worlds: list[str] = Field(default_factory=lambda: ["shop", "calendar", "bank"],
                              description="embedded worlds whose generated tasks train and evaluate")
    task_file: str | None = Field(None, description="your JSONL task file (docs/tasks.md) instead of the "
                                  "embedded worlds' tasks")
    world: str | dict[str, Any] | None = Field(
        None, description="the real environment of task-file tasks whose env names none: a registered name, "
        "package.module:Name or path/to/tools.py[:Class], mcp:COMMAND, an http(s) MCP URL, or a mapping of "
        "MCP settings (command/url, timeout_s, reset_tool, ...). Without one, schema-only tasks train by "
        "rehearsal and the eval is rehearsal-judged")
    trust_task_worlds: bool = Field(False, description="let the task file's own env.world entries run code (mcp: "
                                    "commands, MCP URLs, .py files, import paths); refused by default: a task "
                                    "file is data (docs/tasks.md)")
    judge: JudgeConfig | None = Field(None, description="LLM judge for `judge` checklist items (none: they are "
                                      "not judged and do not count)")
    difficulties: list[int] | None = Field(None, description="task difficulty levels to use (default: all)")
    report_to: list[Literal["tensorboard", "wandb", "trackio"]] = Field(
        default_factory=list, description="experiment trackers besides metrics.jsonl (optional extras)")
    report_samples_every: int = Field(5, ge=0, description="a table of sampled trajectories to the trackers "
                                      "every N steps (0: none)")
    wandb_mode: Literal["offline", "online"] = Field("offline", description="online uploads to W&B")
    tracker_project: str = Field("envace", description="project name in the trackers (W&B, trackio)")
    tool_distractors: int | None = Field(None, ge=0, description="show only needed tools + N others (default: all tools)")
    tasks_per_world: int = Field(300, ge=1, description="generated tasks per embedded world (ids 0..N-1, both splits)")
    n_examples: int = Field(3, ge=0, description="real call/result examples per generated task (simulator grounding)")
    grounding: Literal["covering", "disjoint"] = Field(
        "covering", description="covering: examples show the looked-up values a rehearsal needs; disjoint: never")
    source: Literal["rehearsal", "real", "simulator"] = Field(
        "rehearsal", description="who answers tool calls during training: the policy rehearsing them, the real "
        "world, or a frozen simulator (sim_model)")
    rl_fresh_tasks: bool = Field(True, description="GRPO draws from train tasks the SFT warm start did not use "
                                 "(all of them when it used every one)")
    rl_pool: int | None = Field(None, ge=1, description="GRPO draws from only N tasks of its pool, seeded, so each "
                                "comes back every few steps: shows whether RL can fit tasks it sees again")
    mode: Literal["share", "noshare", "caller_only", "frozen_caller"] = Field(
        "share", description="share: one model plays both roles; noshare: two models; caller_only: the "
        "simulator stays frozen; frozen_caller: only the simulator trains")
    steps: int = Field(20, ge=0, description="GRPO steps (0: only the warm start and the eval)")
    tasks_per_step: int = Field(4, ge=1, description="tasks rolled out per GRPO step")
    group_size: int = Field(4, ge=1, description="episodes per task per step (G); advantages are centred "
                            "within a task's group")
    dynamic_sampling: int = Field(
        0, ge=0, description="DAPO's dynamic sampling: only task groups with signal (episodes that scored "
        "differently) train, and while fewer than tasks_per_step of them are in hand, up to N more rounds of "
        "tasks_per_step fresh tasks are rolled out (each round costs a step's rollouts). 0: off, every group trains")
    memory_episodes: int = Field(
        0, ge=0, description="of each task's group_size episodes per step, this many run with a rehearsal "
        "memory (memory_style) condensed from the task's other episodes in their caller prompt, so GRPO teaches the policy to use what it rehearsed before a committed run (test-time "
        "rehearsal). 0: none")
    memory_style: Literal["rule", "plan"] = Field(
        "rule", description="the memory of memory_episodes, as `envace eval --memory`: rule (failed and working "
        "calls, the answer reached) or plan (only the calls of the best-looking attempt)")
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    prompt: PromptStyle = Field(default_factory=PromptStyle)
    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    bench: BenchTrainConfig | None = Field(None, description="train on a paper benchmark's entries (its scorer "
                                           "as reward, its environment for the eval) instead of `worlds`")
    out: str = Field("runs", description="the folder run directories are created in")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: one per idle core, "
                                "checked again between steps)")
    mmap_threshold_kib: int | None = Field(
        DEFAULT_MMAP_THRESHOLD // 1024, ge=1, le=32768, description="CPU buffers of this many KiB or more get "
        "memory of their own, handed back to the system when freed (glibc; policy/allocator.py): without it the "
        "C heap fragments and a run's peak memory grows step after step (docs/results.md). null: glibc's default")
    mixed_precision: Literal["no", "bf16"] = Field(
        "no", description="the SFT and GRPO updates' forward in bf16 autocast (weights, gradients and optimiser "
        "state stay fp32): faster on GPUs and on CPUs with AVX512-BF16 or AMX; log-probs then carry bf16 "
        "rounding (docs/results.md). Rollouts' dtype: rollout.dtype. Under accelerate launch, accelerate's own "
        "--mixed_precision applies as well")
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?|mps|xpu(:\d+)?)$",
                        description="torch device of a one-process run: auto (cuda when available, else cpu), "
                        "cpu, cuda, cuda:1, mps; under accelerate launch each rank takes its own")
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp", description="how several processes (accelerate launch) train: ddp: every rank holds the whole "
        "model and optimiser state and gradients are all-reduced; fsdp: the trained model's weights, gradients "
        "and optimiser state are sharded over the ranks (torch FSDP2, per decoder layer) and each rank keeps a "
        "whole-weight copy for rollouts and evals, refreshed after every step (docs/scaling.md). One process: "
        "ignored")

    @field_validator("mixed_precision", mode="before")
    @classmethod
    def _no_is_not_false(cls, v: Any) -> Any:
        return "no" if v is False else v  # YAML reads a bare `no` (and --set mixed_precision=no) as false

    @field_validator("memory_episodes")
    @classmethod
    def _memory_below_group(cls, v: int, info: ValidationInfo) -> int:
        g = info.data.get("group_size")  # declared before: validated first (absent if it failed)
        if v and g is not None and v >= g:
            raise ValueError(f"memory_episodes ({v}) must be below group_size ({g}): the memory is written "
                             "from the task's other episodes")
        return v

    @property
    def eval_on_rollout_backend(self) -> bool:
        """Whether evals generate on the rollouts' backend (``eval.backend``; auto: llama.cpp only)."""
        if self.eval.backend == "auto":
            return self.rollout.backend == "llamacpp"
        return self.eval.backend == "rollout"

    @model_validator(mode="after")
    def _llamacpp_rollouts_are_rescored(self) -> TrainConfig:
        if self.rollout.backend != "llamacpp":
            return self
        if self.rollout.recompute_logprobs is False:
            raise ValueError("rollout.backend llamacpp: its log-probs come from other (quantised) weights; "
                             "rollout.recompute_logprobs must stay on")
        if "is_cap" not in self.grpo.model_fields_set:
            self.grpo.is_cap = 2.0  # the truncated importance weight, as TRL's default for vLLM
        return self

    @model_validator(mode="after")
    def _vocab_needs_scratch_model(self) -> TrainConfig:
        if self.sft.vocab is not None and not self.model.strip().startswith("llama:"):
            raise ValueError(f"sft.vocab: a data vocabulary is for a model trained from scratch (model: "
                             f"llama:HIDDENxLAYERS), not {self.model!r}, whose embeddings fix its vocabulary")
        if self.memory_episodes and self.bench is not None:
            raise ValueError("memory_episodes: not with bench (its episodes run in the benchmark's own loop)")
        if self.sft.vocab is not None and not self.sft.enabled:
            raise ValueError("sft.vocab: the vocabulary is learned from the SFT warm start's text; "
                             "it needs sft.enabled: true")
        if self.source == "real" and self.eval.world is not None and self.eval.world != self.world:
            raise ValueError("eval.world: with source real the run's world answers training and eval alike; set "
                             "world: to it, not eval.world")
        return self


class ConfigError(ValueError):
    pass


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``1e-4`` (no dot) as a string; configs mean a number."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                    |\.[0-9_]+(?:[eE][-+][0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc)


def parse_config(data: dict[str, Any], origin: str = "<config>") -> TrainConfig:
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        msgs = [f"{origin}: field '{_loc(err['loc'])}': {err['msg']}" for err in e.errors()]
        raise ConfigError("\n".join(msgs)) from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``key.sub=value`` overrides; values are parsed as YAML (numbers, booleans, lists)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        node = data
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p} is not a section")
        try:
            node[parts[-1]] = yaml_load(raw)
        except yaml.YAMLError as e:
            first = str(e).strip().splitlines()[0]
            raise ConfigError(f"override {item!r}: the value is not valid YAML ({first})") from None
    return data


def load_config(path: str | Path | None, overrides: list[str] | None = None,
                values: dict[str, Any] | None = None) -> TrainConfig:
    """``overrides``: ``key=value`` strings (YAML values); ``values``: top-level settings as given
    (command-line flags), applied last."""
    data: dict[str, Any] = {}
    origin = "<defaults>"
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"config file {path} does not exist")
        if not path.is_file():
            raise ConfigError(f"{path}: not a file (give a YAML config file, e.g. configs/demo.yaml)")
        try:
            data = yaml_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        if data is None:
            raise ConfigError(f"{path}: the config file is empty (leave --config out to run the defaults)")
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of settings")
        origin = str(path)
    data = apply_overrides(data, overrides or [])
    for key, value in (values or {}).items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_config(data, origin)
