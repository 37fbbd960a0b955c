"""The KV cache: one kind of layer cache per layer, the paged pool, and the probe a pass reports through."""
