"""A paged KV cache for many requests at once: a pool of fixed-size blocks, a block table per request, a free
list, and prefix sharing with reference counts and copy-on-write, as vLLM's paged attention and block hashing do.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import torch

from kvviz.cache.layers import Held


class PoolExhausted(RuntimeError):
    """The pool has no free block left for a request that grows."""


class PagedCache:
    """Keys and values of several requests in one pool of `num_blocks` blocks of `block_size` positions.

    The pool is one tensor shaped (layers, 2, num_blocks * block_size, kv_heads, head_dim): slot
    `block * block_size + offset` holds the key (index 0) and value (1) of one position. A request's block table
    lists the physical blocks its positions 0, 1, ... live in, `block_size` to a block. Blocks come from the free
    list as requests grow and go back when the last request referencing them is released.

    Prefix sharing: a request admitted with `admit` reuses the blocks of the longest prefix of its prompt that
    some block already holds, found by each block's parent and tokens (a full block's key in `full_blocks`, as
    vLLM hashes a block with its parent's hash), and takes a reference on each. Writing a position whose slot in
    a block someone else already filled copies the block's agreed part first (copy-on-write), so sharing never
    changes what a request reads.

    A pass is planned with `prepare(rows, tokens)`; each layer's `update` then writes the pass's keys and values
    and returns every row's keys and values so far, padded to the longest row (the padding is masked by position:
    the keys come back in position order). `crop` rolls one request back to fewer positions (a speculative
    round's rejected drafts), `release` drops it.
    """

    streams = False  # no attention sinks: positions are the text's

    def __init__(self, n_layer: int, n_kv_head: int, head_dim: int, num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 share_prefixes: bool = True, prefix_cache: str = "") -> None:
        if block_size <= 0 or num_blocks <= 0:
            raise ValueError(f"a pool needs blocks of at least one position, got {num_blocks} x {block_size}")
        self.kv = torch.zeros((n_layer, 2, num_blocks * block_size, n_kv_head, head_dim), dtype=dtype,
                              device=device)  # (L, 2, slots, nkv, hd)
        self.n_layer, self.num_blocks, self.block_size = n_layer, num_blocks, block_size
        if prefix_cache not in ("", "hash", "radix"):
            raise ValueError(f"unknown prefix cache {prefix_cache!r}")
        self.share_prefixes = share_prefixes or bool(prefix_cache)
        self.prefix_cache = prefix_cache
        self.cached: OrderedDict[int, None] = OrderedDict()  # blocks no request holds, least recently used first
        self.hits = [[0] * block_size for _ in range(num_blocks)]  # per slot: admissions whose prefix it held
        self.evicted = 0  # cached blocks evicted so far
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.parent = [-1] * num_blocks  # the block before this one in every table that holds it (-1: the first)
        self.block_tokens: list[list[int]] = [[] for _ in range(num_blocks)]  # the tokens whose K/V each block holds
        self.full_blocks: dict[tuple[int, tuple[int, ...]], int] = {}  # (parent, tokens) of a full block -> block
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self.copies = 0  # copy-on-write copies made so far
        self.reused = [0] * n_layer  # per layer: rows the latest update returned without writing them
        self._rows: list[int] = []
        self._write_slots = torch.zeros(0, dtype=torch.long)
        self._read_slots = torch.zeros((0, 0), dtype=torch.long)
        self._mask: torch.Tensor | None = None  # a flattened pass's (ΣT, ΣS)

    @property
    def bytes_per_block(self) -> int:
        return self.kv[:, :, : self.block_size].numel() * self.kv.element_size()

    @property
    def bytes_per_position(self) -> int:
        return self.bytes_per_block // self.block_size

    @property
    def bytes_allocated(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def blocks_in_use(self) -> list[int]:
        return [b for b in range(self.num_blocks) if self.refs[b] > 0]

    def admit(self, request: int, prompt_ids: list[int]) -> int:
        """Open a block table for `request`; with prefix sharing, reference the blocks that already hold the
        longest prefix of `prompt_ids` (all but its last token, whose logits the request needs). Returns the
        positions reused."""
        if request in self.tables:
            raise ValueError(f"request {request} is already in the cache")
        table: list[int] = []
        matched, parent, limit = 0, -1, len(prompt_ids) - 1
        while self.share_prefixes and matched < limit:
            chunk = tuple(prompt_ids[matched: matched + self.block_size])
            whole = self.full_blocks.get((parent, chunk)) if matched + len(chunk) <= limit else None
            if whole is not None and len(chunk) == self.block_size:
                table.append(self._take(whole, self.block_size))
                matched, parent = matched + self.block_size, whole
                continue
            if self.prefix_cache == "hash":  # whole blocks only
                break
            best, agreed = -1, 0
            for block in range(self.num_blocks):
                if (self.refs[block] or block in self.cached) and self.parent[block] == parent:
                    same = _common_prefix(self.block_tokens[block], chunk[: limit - matched])
                    if same > agreed:
                        best, agreed = block, same
            if best >= 0:
                table.append(self._take(best, agreed))
                matched += agreed
            break
        self.tables[request], self.lengths[request] = table, matched
        return matched

    def _take(self, block: int, matched: int) -> int:
        """A reference on a block whose first `matched` slots a prefix matched (out of the cached ones, if no one
        held it)."""
        self.cached.pop(block, None)
        self.refs[block] += 1
        for slot in range(matched):
            self.hits[block][slot] += 1
        return block

    def withdraw(self, request: int) -> None:
        """Undo `admit` (a request that must wait after all): release its blocks, and its hits never happened."""
        position = 0
        for block in self.tables[request]:
            for slot in range(min(self.block_size, self.lengths[request] - position)):
                self.hits[block][slot] -= 1
            position += self.block_size
        self.release(request)

    def available(self) -> int:
        """Blocks a request can still claim: the free ones and the cached ones (evicted for it)."""
        return len(self.free) + len(self.cached)

    def blocks_needed(self, request: int, tokens: int) -> int:
        """Blocks feeding `tokens` more positions to `request` claims: new blocks past its table's end, and a copy
        of the block it ends inside where someone else filled the slot it writes next (copy-on-write)."""
        table, start, bs = self.tables[request], self.lengths[request], self.block_size
        needed = max(0, -(-(start + tokens) // bs) - len(table))
        index, offset = divmod(start, bs)
        if tokens and index < len(table) and len(self.block_tokens[table[index]]) != offset:
            needed += 1
        return needed

    def prepare(self, rows: list[int], tokens: list[list[int]], flat: bool = False) -> torch.Tensor:
        """Plan a pass that feeds `tokens[i]` to request `rows[i]` at its next positions: claim and copy blocks as
        needed, and work out where each layer writes and reads. Returns the positions, (T,) for one row, (B, T)
        for several (every row feeds as many tokens). `flat`: the rows' tokens one after another as one row of
        the pass, as many as each has (a server's pass: decode steps and prefill chunks together); the positions
        are then (ΣT,), and each layer's keys are every row's, one after another, with a mask (ΣT, ΣS) that lets
        a query see its own request's keys up to its position."""
        if len(rows) > 1 and len({len(t) for t in tokens}) != 1 and not flat:
            raise ValueError("a batched pass feeds every row the same number of tokens")
        bs, write, starts = self.block_size, [], []
        for request, fed in zip(rows, tokens, strict=True):
            table, start = self.tables[request], self.lengths[request]
            starts.append(start)
            for position, token in enumerate(fed, start):
                index, offset = divmod(position, bs)
                if index == len(table):
                    table.append(self._claim(table[-1] if table else -1))
                block = table[index]
                if len(self.block_tokens[block]) != offset:  # someone else wrote this slot: copy what we agree on
                    block = table[index] = self._copy(block, offset)
                self.block_tokens[block].append(token)
                write.append(block * bs + offset)
                if offset == bs - 1 and self.share_prefixes:
                    self.full_blocks.setdefault((self.parent[block], tuple(self.block_tokens[block])), block)
            self.lengths[request] = start + len(fed)
        if flat:
            return self._flat(rows, tokens, starts, write)
        self._mask = None
        longest = max(self.lengths[r] for r in rows)
        read = torch.zeros((len(rows), longest), dtype=torch.long)  # (B, S): padding reads slot 0, masked
        for i, request in enumerate(rows):
            n = self.lengths[request]
            blocks = torch.tensor(self.tables[request], dtype=torch.long)
            slots = (blocks[:, None] * bs + torch.arange(bs)[None, :]).flatten()[:n]
            read[i, :n] = slots
        device = self.kv.device
        self._rows, self._write_slots, self._read_slots = list(rows), torch.tensor(write, device=device), \
            read.to(device)
        T = len(tokens[0])
        positions = torch.tensor(starts, device=device)[:, None] + torch.arange(T, device=device)[None, :]  # (B, T)
        return positions[0] if len(rows) == 1 else positions

    def _flat(self, rows: list[int], tokens: list[list[int]], starts: list[int], write: list[int]) -> torch.Tensor:
        bs, device = self.block_size, self.kv.device
        slots, owner, key_positions, query_owner, query_positions = [], [], [], [], []
        for i, (request, start, fed) in enumerate(zip(rows, starts, tokens, strict=True)):
            n = self.lengths[request]
            blocks = torch.tensor(self.tables[request], dtype=torch.long)
            slots.append((blocks[:, None] * bs + torch.arange(bs)[None, :]).flatten()[:n])
            owner += [i] * n
            key_positions.append(torch.arange(n))
            query_owner += [i] * len(fed)
            query_positions.append(torch.arange(start, start + len(fed)))
        keys, queries = torch.cat(key_positions), torch.cat(query_positions)
        self._mask = ((torch.tensor(query_owner)[:, None] == torch.tensor(owner)[None, :])
                      & (keys[None, :] <= queries[:, None])).to(device)  # (ΣT, ΣS)
        self._rows, self._write_slots = list(rows), torch.tensor(write, device=device)
        self._read_slots = torch.cat(slots)[None].to(device)  # (1, ΣS)
        return queries.to(device)

    def update(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Held:
        """Store `k`, `v` (B, nkv, T, hd) where `prepare` planned; return every row's keys and values,
        (B, nkv, S, hd) each, S the longest row's positions, padded after each row's last."""
        B, nkv, T, hd = k.shape
        if self._mask is not None:
            return self._update_flat(layer, k, v)
        if B != len(self._rows):
            raise ValueError(f"the pass feeds {B} rows but was prepared for {len(self._rows)}")
        keys, values = self.kv[layer].unbind(0)  # (slots, nkv, hd) each
        keys.index_copy_(0, self._write_slots, k.transpose(1, 2).reshape(B * T, nkv, hd))
        values.index_copy_(0, self._write_slots, v.transpose(1, 2).reshape(B * T, nkv, hd))
        self.reused[layer] = sum(self.lengths[r] for r in self._rows) - B * T
        S = self._read_slots.shape[1]
        read = self.kv[layer].index_select(1, self._read_slots.flatten()).view(2, B, S, nkv, hd)
        return Held(read[0].transpose(1, 2), read[1].transpose(1, 2))  # (B, nkv, S, hd) each, in position order

    def _update_flat(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Held:
        _, nkv, T, hd = k.shape  # (1, nkv, ΣT, hd): the rows' tokens one after another
        keys, values = self.kv[layer].unbind(0)
        keys.index_copy_(0, self._write_slots, k[0].transpose(0, 1))
        values.index_copy_(0, self._write_slots, v[0].transpose(0, 1))
        S = self._read_slots.shape[1]
        self.reused[layer] = S - T
        read = self.kv[layer].index_select(1, self._read_slots[0]).view(2, 1, S, nkv, hd)
        return Held(read[0].transpose(1, 2), read[1].transpose(1, 2), mask=self._mask)

    def release(self, request: int) -> None:
        """Drop `request`'s references; blocks no one references go back to the free list (or stay cached, the
        last one first, so that a prefix cache evicts a sequence from its end)."""
        for block in reversed(self.tables.pop(request)):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self._free(block)
        del self.lengths[request]

    def crop(self, request: int, position: int) -> None:
        """Roll `request` back to its first `position` positions, as if it had never been fed past them. The blocks
        wholly past them drop its reference (and go back to the free list where no other request holds them); the
        block it now ends inside, if no one else holds it, forgets its tokens past the end, so the next pass writes
        there in place. A block shared with another request keeps them: the next write copies it first."""
        if request not in self.tables:
            raise ValueError(f"request {request} is not in the cache")
        length, table, bs = self.lengths[request], self.tables[request], self.block_size
        if not 0 <= position <= length:
            raise ValueError(f"request {request} holds {length} positions: it cannot crop to {position}")
        kept = -(-position // bs)  # blocks its first `position` positions take
        for block in table[kept:]:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self._free(block)
        del table[kept:]
        if table and self.refs[table[-1]] == 1:
            self._forget(table[-1], position - (kept - 1) * bs)
        self.lengths[request] = position

    def _claim(self, parent: int) -> int:
        if not self.free and self.cached:
            _evict(self)
        if not self.free:
            raise PoolExhausted(f"the pool's {self.num_blocks} blocks of {self.block_size} positions are all in use")
        block = self.free.popleft()
        self.refs[block], self.parent[block], self.block_tokens[block], self.hits[block] = 1, parent, [], \
            [0] * self.block_size
        return block

    def _copy(self, shared: int, agreed: int) -> int:
        """A block of our own holding the first `agreed` positions of `shared` (copy-on-write)."""
        block = self._claim(self.parent[shared])
        bs = self.block_size
        self.kv[:, :, block * bs: block * bs + agreed] = self.kv[:, :, shared * bs: shared * bs + agreed]
        self.block_tokens[block] = self.block_tokens[shared][:agreed]
        self.refs[shared] -= 1
        if self.refs[shared] == 0:
            self._free(shared)
        self.copies += 1
        return block

    def _forget(self, block: int, keep: int) -> None:
        """Keep only the first `keep` tokens of `block`: fewer, and it is no longer a full block admit() can share."""
        if len(self.block_tokens[block]) <= keep:
            return
        key = (self.parent[block], tuple(self.block_tokens[block]))
        if self.full_blocks.get(key) == block:
            del self.full_blocks[key]
        del self.block_tokens[block][keep:]

    def _free(self, block: int) -> None:
        """A block no request references: cached for a later prefix where a prefix cache keeps it (radix: any
        block with tokens; hash: a full one), else back to the free list."""
        tokens = self.block_tokens[block]
        if self.prefix_cache == "radix" and tokens or self.prefix_cache == "hash" and \
                self.full_blocks.get((self.parent[block], tuple(tokens))) == block:
            self.cached[block] = None
            return
        self._forget(block, 0)
        self.parent[block] = -1
        self.free.append(block)


def _common_prefix(held: list[int], wanted: tuple[int, ...]) -> int:
    n = 0
    for a, b in zip(held, wanted, strict=False):
        if a != b:
            break
        n += 1
    return n


def _evict(cache: PagedCache) -> None:
    """Free the least recently used cached block (radix: the least recently used leaf), and, under "hash",
    the cached blocks after it, which no prefix reaches any more."""
    parents = {cache.parent[b] for b in range(cache.num_blocks) if cache.refs[b] or b in cache.cached}
    victim = next((b for b in cache.cached if cache.prefix_cache != "radix" or b not in parents), None)
    if victim is None:  # every cached block has a child (only live blocks below): the oldest one
        victim = next(iter(cache.cached))
    doomed, frontier = [victim], [victim]
    while frontier:  # its cached descendants: their parent's number is about to mean another block
        below = [b for b in cache.cached if cache.parent[b] in frontier and b not in doomed]
        doomed += below
        frontier = below
    for block in doomed:
        del cache.cached[block]
        cache._forget(block, 0)
        cache.parent[block] = -1
        cache.hits[block] = [0] * cache.block_size
        cache.free.append(block)
        cache.evicted += 1
