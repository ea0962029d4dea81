"""tokentrace: a self-hosted performance lab for LLM inference."""

__version__ = "0.1.0"
