"""Errors the engine raises before any compute, each naming what was at fault."""


class LanesError(Exception):
    """Base class for errors a caller can show to a person as they are."""


class ModelLoadError(LanesError):
    """A model could not be found or loaded (names the path or model)."""


class PromptTooLongError(LanesError):
    """A prompt plus its max tokens exceeds the model's context limit."""


class MemoryLimitError(LanesError):
    """A request whose reply could never fit this machine's memory limit for the model (names both)."""


class StoreError(LanesError):
    """The conversation store could not be opened or used (names the file)."""


class NotLanesDatabaseError(StoreError):
    """The database file exists but is not one Lanes made; it is left untouched."""


class NewerSchemaError(StoreError):
    """The database was made by a newer Lanes; it is left untouched."""


class NotFoundError(LanesError):
    """A conversation or message id that does not exist."""
