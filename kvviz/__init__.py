"""kvviz: see the KV cache of a GPT work, token by token."""

__version__ = "0.1.0"
