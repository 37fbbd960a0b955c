"""The quantities a lesson's question may name, with the words the app and the slides ask them in, and the kinds of
step each kind of question needs. Torch-free and Qt-free."""

from __future__ import annotations

QUESTIONS = {
    "next_kv_with_cache": "How many K/V computations per layer will the next step make with the cache?",
    "next_kv_without_cache": "How many K/V computations per layer will the next step make without the cache?",
    "avoided_after_next": "After the next step, how many K/V computations per layer will the cache have avoided?",
    "ratio_after_next": "After the next step, how many times less K/V work will the cache have done?",
    "cache_bytes_after_next": "After the next step, how many bytes will the KV cache hold?",
    "cache_bytes_per_token": "How many bytes of KV cache does one token take, over all layers?",
    "cache_bytes_at_8k": "How many bytes will this model's KV cache hold at 8,192 tokens?",
    "cache_bytes_at_1k": "How many bytes will this model's KV cache hold after 1,000 tokens?",
    "shared_layer_kv": "At the next step, how many keys and values will a shared layer compute (its last layer)?",
    "blocks_at_end": "When every request is done, how many blocks of the pool will the batch hold?",
    "sink_attention_share": "At the next step, what share of its attention will the newest token give the sinks, "
                            "the first positions (mean over layers and heads)?",
    "positions_held_after_next": "After the next step, how many positions will the model's KV cache hold?",
    "acceptance_rate_after_next": "After the next round, what share of all the drafts so far will the model have "
                                  "accepted (in %)?",
    "kept_positions_after_next": "After the next step, which positions will layer 0 (L0) keep?",
    "window_vs_importance_perplexity": "How many times {method}'s perplexity will a window's be, each keeping "
                                       "{budget} positions a layer?",
    "sink_perplexity_ratio": "How many times the perplexity with the {sinks} sinks will a plain window's be, each "
                             "keeping {positions} positions?",
    "prefix_hits_at_admission": "When {request} is admitted, how many of its prompt tokens will the prefix cache "
                                "already hold?",
    "blocks_freed_by_preemption": "When the pool runs out and the scheduler preempts a request, how many blocks will "
                                  "that request free?",
}
ATTENTION_QUESTIONS = ("sink_attention_share",)  # answered from the attention weights: the run records them
BATCH_QUESTIONS = ("blocks_at_end",)  # asked of a serving step (a batch of `prompts`), answered by its last pass
SPECULATIVE_QUESTIONS = ("acceptance_rate_after_next",)  # answered from the rounds of a speculative step's run
# asked of a step that evicts by importance (`evict`); the first is answered from the run's eviction record
EVICTION_QUESTIONS = ("kept_positions_after_next", "window_vs_importance_perplexity")
# answered by perplexities measured on the shipped held-out text (kvviz.lessons.perplexity), not by the step's run
PERPLEXITY_QUESTIONS = ("window_vs_importance_perplexity", "sink_perplexity_ratio")
SINK_QUESTIONS = ("sink_attention_share", "sink_perplexity_ratio")  # asked of a step with sinks (and a window)
# asked of a trace step, answered by the first record after its `advance_to` passes that holds the answer: the named
# request's admission (the prompt positions it found cached), the first preemption (the blocks only its victim held)
TRACE_QUESTIONS = ("prefix_hits_at_admission", "blocks_freed_by_preemption")
