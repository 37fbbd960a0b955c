"""The Qt-free core: records, the KV cache, the engine, counting, compare mode, memory, tokenizer, lessons."""
