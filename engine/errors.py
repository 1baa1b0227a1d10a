"""Errors the engine raises before any compute, each naming what was at fault."""


class LanesError(Exception):
    """Base class for errors a caller can show to a person as they are."""


class ModelLoadError(LanesError):
    """A model could not be found or loaded (names the path or model)."""


class PromptTooLongError(LanesError):
    """A prompt plus its max tokens exceeds the model's context limit."""
