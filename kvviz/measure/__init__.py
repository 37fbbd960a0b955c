"""Measured speed: the headless benchmark against the transformers peer, and the speed sweep."""
