"""envace: world-rehearsal agentic RL for tool-using LLM agents."""

__version__ = "0.2.0"
