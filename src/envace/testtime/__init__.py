"""Test-time private rehearsal (parallel / sequential), rehearsal memory, the committed real run,
and world-model fidelity of the policy's rehearsed tool responses."""

from envace.testtime.fidelity import (
    FidelityCase,
    FidelityPair,
    ResponseMatch,
    cases_from_trajectories,
    compare_responses,
    error_probe_cases,
    measure_fidelity,
    same_structure,
    summarize_fidelity,
)
from envace.testtime.fields import important_fields, key_matters
from envace.testtime.memory import (
    Memory,
    MemoryWriter,
    ModelMemoryWriter,
    RuleMemoryWriter,
    make_memory_writer,
    rule_memory,
)
from envace.testtime.rehearsal import (
    MODES,
    REHEARSE_MODES,
    ConditionResult,
    CountingSource,
    MemoryActor,
    RecordingRealSource,
    Rehearsal,
    RehearsalSet,
    TaskOutcome,
    budget_sweep,
    check_mode_budget,
    commit,
    commit_condition,
    episodes_with_memory,
    memories_after,
    rehearse,
    run_private_rehearsal,
)

__all__ = [
    "FidelityCase", "FidelityPair", "ResponseMatch", "cases_from_trajectories", "compare_responses",
    "error_probe_cases", "measure_fidelity", "same_structure", "summarize_fidelity", "important_fields",
    "key_matters", "Memory", "MemoryWriter", "ModelMemoryWriter", "RuleMemoryWriter", "make_memory_writer",
    "rule_memory", "MODES", "REHEARSE_MODES", "ConditionResult", "CountingSource", "MemoryActor",
    "RecordingRealSource", "Rehearsal", "RehearsalSet", "TaskOutcome", "budget_sweep", "check_mode_budget",
    "commit", "commit_condition", "episodes_with_memory", "memories_after", "rehearse", "run_private_rehearsal",
]
