"""The model runtime: finding and loading models (GGUF, mlx-lm folders), families' settings, the
caches every stream holds (``lane_cache``) and how each kind rolls back (``cache_kinds``,
``state_replay``), the turn cache, chat templates, memory limits and the machine (OpenBLAS)."""
