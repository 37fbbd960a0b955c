"""The engine: a request becomes a plan, then a generator of step records (single runs, compare, serving)."""
