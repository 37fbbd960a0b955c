"""What a pass of the server leaves behind, as a record (kvviz.core.serve_records): the pool's blocks (held,
cached, free), the prefix tree of token runs with its hits, and the scheduler's decision in one sentence."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvviz.cache.paged import PagedCache
from kvviz.core.batch_records import BlockState
from kvviz.core.counting import plural
from kvviz.core.serve_records import FINISHED, PassRow, RadixNode, ServeRecord

Server = Any  # kvviz.engine.scheduler's _Server: the queues, the outputs, the pool (not imported: it imports this)


def pool_record(server: Server, step: int, rows: list[PassRow], admitted: list[int], hits: list[int],
                preempted: list[int], freed: list[int], evicted: int, seconds: float) -> ServeRecord:
    cache, plan, label = server.cache, server.plan, server.engine.tokenizer.token_label
    n = len(plan.requests)
    owners: dict[int, list[int]] = {}
    for request in sorted(cache.tables):
        for block in cache.tables[request]:
            owners.setdefault(block, []).append(request)

    def block_state(block: int, held_by: tuple[int, ...]) -> BlockState:
        first = _first_position(cache, block)
        tokens = tuple(cache.block_tokens[block])
        return BlockState(block, held_by, first, tokens, tuple(label(t) for t in tokens))

    held = tuple(block_state(b, tuple(owners[b])) for b in sorted(owners))
    cached = tuple(block_state(b, ()) for b in sorted(cache.cached))
    final = all(s == FINISHED for s in server.states)
    return ServeRecord(
        step=step, rows=tuple(rows), states=tuple(server.states),
        outputs=tuple(tuple(o) for o in server.outputs),
        output_labels=tuple(tuple(label(t) for t in o) for o in server.outputs),
        lengths=tuple(cache.lengths.get(i, 0) for i in range(n)),
        tables=tuple(tuple(cache.tables.get(i, ())) for i in range(n)),
        blocks=held, cached_blocks=cached, free_blocks=tuple(sorted(cache.free)), num_blocks=cache.num_blocks,
        block_size=cache.block_size, admitted=tuple(admitted), cached_tokens=tuple(hits),
        preempted=tuple(preempted), freed_blocks=tuple(freed), evicted=evicted,
        decision=decision(server, step, rows, admitted, hits, preempted, freed, evicted),
        tree=prefix_tree(cache, label) if plan.prefix_cache == "radix" else (), seconds=seconds, final=final)


def _first_position(cache: PagedCache, block: int) -> int:
    """The position a block's first slot holds: its depth in the chain of parents."""
    depth, parent = 0, cache.parent[block]
    while parent >= 0:
        depth, parent = depth + 1, cache.parent[parent]
    return depth * cache.block_size


def decision(server: Server, step: int, rows: list[PassRow], admitted: list[int], hits: list[int],
             preempted: list[int], freed: list[int], evicted: int) -> str:
    """The pass's decision in one sentence: "Pass 7: admitted document, 0 of its 184 prompt tokens cached, and
    prefilled 32 of them; chat 1, chat 2 and chat 3 decoded one token each."."""
    plan = server.plan
    name = [r.name for r in plan.requests]
    parts = []
    for victim, blocks in zip(preempted, freed, strict=True):
        parts.append(f"the pool ran out: preempted {name[victim]}, the youngest, freeing {plural(blocks, 'block')}; "
                     f"it will compute its {len(server.tokens(victim))} tokens again")
    if evicted:
        parts.append(f"evicted {plural(evicted, 'cached block')}")
    chunk_of = {row.request: row for row in rows if row.prefill}
    for request, hit in zip(admitted, hits, strict=True):
        total = len(server.tokens(request)) - (chunk_of[request].chosen is not None)  # as admitted
        what, of = ("restarted", "tokens") if server.restarts[request] else ("admitted", "prompt tokens")
        parts.append(f"{what} {name[request]}: {hit} of its {total} {of} were cached, "
                     f"{chunk_of[request].tokens} prefilled now")
    going = [row for row in rows if row.prefill and row.request not in admitted]
    if going:
        parts.append(_join([f"{name[r.request]} prefilled {r.tokens} more" for r in going]))
    decoded = [name[row.request] for row in rows if not row.prefill]
    if decoded:
        parts.append(f"{_join(decoded)} decoded a token{' each' if len(decoded) > 1 else ''}")
    done = [name[row.request] for row in rows if server.states[row.request] == FINISHED]
    if done:
        parts.append(f"{_join(done)} finished")
    later = [r for r in plan.requests if r.arrive_at_pass > step]
    if later and not server.running and not server.waiting:  # the passes until then are skipped
        parts.append(f"nothing runs until pass {later[0].arrive_at_pass}, when {later[0].name} arrives")
    if not parts:
        parts.append("nothing to run")
    return f"Pass {step}: " + "; ".join(parts) + "."


def _join(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


class _Trie:
    __slots__ = ("children", "hits", "live", "blocks")

    def __init__(self) -> None:
        self.children: dict[int, _Trie] = {}
        self.hits, self.live, self.blocks = 0, False, set()


def prefix_tree(cache: PagedCache, label: Callable[[int], str]) -> tuple[RadixNode, ...]:
    """The token runs the pool holds (running requests' blocks and cached ones) as a radix tree: a trie of every
    chain of blocks from the first position, each chain of single children with the same hits and state merged
    into one node. Nodes in depth-first order, each after its parent."""
    present = [b for b in range(cache.num_blocks) if cache.refs[b] or b in cache.cached]
    below: dict[int, list[int]] = {}
    for block in present:
        below.setdefault(cache.parent[block], []).append(block)
    root = _Trie()

    def walk(block: int, node: _Trie) -> None:
        for slot, token in enumerate(cache.block_tokens[block]):
            node = node.children.setdefault(token, _Trie())
            node.hits += cache.hits[block][slot]
            node.live |= cache.refs[block] > 0
            node.blocks.add(block)
        for child in below.get(block, ()):
            walk(child, node)

    for block in below.get(-1, ()):
        walk(block, root)
    nodes: list[RadixNode] = []

    def emit(first: int, node: _Trie, parent: int) -> None:
        run, blocks = [first], set(node.blocks)
        while len(node.children) == 1:
            (token, child), = node.children.items()
            if child.hits != node.hits or child.live != node.live:
                break
            run.append(token)
            blocks |= child.blocks
            node = child
        nodes.append(RadixNode(parent, tuple(run), tuple(label(t) for t in run), node.hits, node.live,
                               tuple(sorted(blocks))))
        here = len(nodes) - 1
        for token, child in node.children.items():
            emit(token, child, here)

    for token, child in root.children.items():
        emit(token, child, -1)
    return tuple(nodes)
