"""Frozen records of a batch of requests served together from a paged KV cache (kvviz.engine.serving).

Torch-free and Qt-free, like kvviz.core.records: the serving view reads them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchRequestPlan:
    """One request of a batch: its prompt and how many tokens it generates."""

    index: int
    prompt: str
    prompt_ids: tuple[int, ...]
    prompt_labels: tuple[str, ...]
    budget: int

    @property
    def final_length(self) -> int:
        """Positions its cache holds at the end: the prompt and every generated token (the last one is fed too)."""
        return len(self.prompt_ids) + self.budget


@dataclass(frozen=True)
class BatchPlan:
    """A validated batch, planned before its first pass: the requests, the block pool, what the naive layout
    would reserve. Passes: one prefill per request, then one decode pass for the whole batch per token."""

    requests: tuple[BatchRequestPlan, ...]
    model_name: str
    n_layer: int
    n_ctx: int
    block_size: int
    num_blocks: int  # the pool: enough for every request's final length without sharing
    share_prefixes: bool
    bytes_per_position: int  # keys and values of one position over all layers
    sampling: str
    run_id: int = 0

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * self.bytes_per_position

    @property
    def max_length(self) -> int:
        """The longest any request grows: what one contiguous buffer per request reserves."""
        return max(r.final_length for r in self.requests)

    @property
    def contiguous_reserved_bytes(self) -> int:
        """One contiguous buffer per request, each at the batch's maximum length."""
        return len(self.requests) * self.max_length * self.bytes_per_position

    @property
    def blocks_unshared(self) -> int:
        """Blocks the requests need at the end without prefix sharing: ceil(final length / block size) each."""
        return sum(-(-r.final_length // self.block_size) for r in self.requests)

    @property
    def passes(self) -> int:
        return len(self.requests) + max(r.budget for r in self.requests)

    @property
    def steps(self) -> int:
        """Step presses from the first pass to the last: one a pass (the session protocol's word, as RunPlan's)."""
        return self.passes

    def steps_done(self, record: BatchRecord) -> int:
        """Step presses that `record` of this batch answers."""
        return record.step + 1


@dataclass(frozen=True)
class BlockState:
    """One physical block in use: which requests reference it and the tokens whose K/V it holds."""

    block: int
    owners: tuple[int, ...]  # request indices, in order
    first_position: int  # the position its first slot holds (the same in every owner's table)
    token_ids: tuple[int, ...]
    token_labels: tuple[str, ...]

    @property
    def shared(self) -> bool:
        return len(self.owners) > 1


@dataclass(frozen=True)
class BatchRecord:
    """One forward pass of a batch: a request's prefill, or one decode step of every running request.

    `tables[i]` is request i's block table (empty before it is admitted and after it is released); `lengths[i]`
    the positions its cache holds; `outputs[i]` its tokens so far. `reused_positions` are prompt positions this
    pass found already cached in shared blocks and did not compute.
    """

    step: int
    prefill: bool
    rows: tuple[int, ...]  # the requests this pass fed
    new_token_ids: tuple[int | None, ...]  # per row: the token chosen (None: the pass only filled the cache)
    outputs: tuple[tuple[int, ...], ...]
    output_labels: tuple[tuple[str, ...], ...]
    lengths: tuple[int, ...]
    tables: tuple[tuple[int, ...], ...]
    blocks: tuple[BlockState, ...]  # the blocks in use, by block number
    free_blocks: tuple[int, ...]
    num_blocks: int
    block_size: int
    kv_computed: int  # K/V rows this pass computed per layer
    reused_positions: int
    copies: int  # copy-on-write copies so far
    bytes_per_position: int
    seconds: float
    final: bool
    finished: tuple[bool, ...]  # per request: its last token is in the cache

    @property
    def blocks_used(self) -> int:
        return len(self.blocks)

    @property
    def blocks_shared(self) -> int:
        return sum(1 for b in self.blocks if b.shared)

    @property
    def paged_bytes(self) -> int:
        """Bytes of the blocks in use (each stored once, however many requests share it)."""
        return self.blocks_used * self.block_size * self.bytes_per_position

    @property
    def used_bytes(self) -> int:
        """Bytes the requests' cached positions take, each request counted on its own (no sharing, no padding)."""
        return sum(self.lengths) * self.bytes_per_position

    @property
    def filled_bytes(self) -> int:
        """Bytes of the block slots actually filled: the paged bytes less the empty tails of blocks."""
        return sum(len(b.token_ids) for b in self.blocks) * self.bytes_per_position

    @property
    def paged_fragmentation_bytes(self) -> int:
        return self.paged_bytes - self.filled_bytes


@dataclass(frozen=True)
class BatchRequest:
    """What the app's serving view asks the worker to run; `run_id` tags the plan and every record."""

    run_id: int
    prompts: tuple[str, ...]
    new_tokens: int = 16
    block_size: int = 8
    share_prefixes: bool = True


@dataclass(frozen=True)
class BatchSpeed:
    """A batch's measured throughput against the same requests one at a time (fastest of `turns` each)."""

    requests: int
    tokens_per_second: float
    sequential_tokens_per_second: float
    turns: int
    turn_speedups: tuple[float, ...] = ()  # each turn's one-at-a-time seconds over its batched seconds

    @property
    def speedup(self) -> float:
        return self.tokens_per_second / self.sequential_tokens_per_second

    @property
    def speedup_clear(self) -> bool:
        """Every turn found the batch faster, or every turn slower: a ratio whose turns straddle 1 (a run of a
        few milliseconds on a busy machine) says nothing."""
        return bool(self.turn_speedups) and (min(self.turn_speedups) > 1 or max(self.turn_speedups) < 1)

    def describe_speedup(self) -> str:
        """"1.93x (turns 1.71-2.10x)", or "not clear (turns 0.92-1.40x)" when the turns disagree."""
        spread = (f" (turns {min(self.turn_speedups):.2f}-{max(self.turn_speedups):.2f}x)"
                  if len(self.turn_speedups) > 1 else "")
        return f"{self.speedup:.2f}x{spread}" if self.speedup_clear else f"not clear{spread}"
