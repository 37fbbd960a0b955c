"""The run machinery: the session, the worker thread that owns the engine, coalesced redraws."""
