"""The serving view: several requests decoded together from a paged KV cache (the block pool, each request's
block table, memory paged against contiguous, and the measured speed of the batch against one at a time)."""
