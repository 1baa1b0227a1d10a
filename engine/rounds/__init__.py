"""Shared rounds: the scheduler that advances every stream in one pass, a stream's state, and the
engine thread that owns MLX and speaks in typed events (``engine.events``)."""
