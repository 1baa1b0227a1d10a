"""The draft policy, pure Python: copy indexes and edits (what to draft), copy rates and the
allocator (what a row is worth, how many to verify), the cost model (what a pass costs) and
verification. Nothing here imports MLX (tests/test_layers.py checks it)."""
