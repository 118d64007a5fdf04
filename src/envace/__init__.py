"""envace: world-rehearsal agentic RL for tool-using LLM agents."""

__version__ = "0.2.0"


def __getattr__(name: str):
    # ``envace.tool`` / ``envace.readonly``: tool settings for a user's Python tools, imported on
    # first use so that ``import envace`` (and ``envace --help``) stays light.
    if name in ("tool", "readonly"):
        from envace.envs import python_tools

        return getattr(python_tools, name)
    raise AttributeError(f"module 'envace' has no attribute {name!r}")
