from __future__ import annotations

import pytest

from envace.core.sampling import SamplingParams


def test_defaults_and_logprob_temperature() -> None:
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=0).logprob_temperature == 1.0
    assert SamplingParams(temperature=0.7).logprob_temperature == 0.7


@pytest.mark.parametrize(
    "kwargs", [{"max_new_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"stop": [""]}]
)
def test_invalid_params_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_the_interface_modules_do_not_import_torch() -> None:
    # rollout/reward import SamplingParams at module level; that must stay cheap.
    import subprocess
    import sys

    code = (
        "import sys, envace.policy, envace.core.sampling, envace.policy.backend;"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
