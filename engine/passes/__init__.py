"""A round's forward pass. The generic one is the model's own mlx-lm forward over the lanes'
cache views; ``grouped``, ``padded`` and ``numpy_pass`` are faster passes for llama-style models
on the CPU, each tested equal to it."""
