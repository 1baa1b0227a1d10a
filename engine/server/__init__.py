"""A local OpenAI-compatible HTTP server over the engine: every request is a stream in the engine's
shared rounds, with copy drafts (``lanes serve``, or the window's Server menu on its own engine)."""
