"""Requests used by the engine tests: one copy-friendly, two open."""

COPY = (
    "Fix the spelling in this sentence and repeat it: The quick brwon fox jumsp over the lazy dog "
    "while the farmer watches from the porch."
)
CODE = (
    "Add a docstring to this function and return the whole function:\n\n"
    "def area(width, height):\n    if width < 0 or height < 0:\n        raise ValueError('negative')\n"
    "    return width * height\n"
)
FRANCE = "What is the capital of France?"
OPEN = "Give me two tips for sleeping better."
