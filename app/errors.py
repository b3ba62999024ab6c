"""Typed errors with a sentence a user can act on. ``ui/`` shows ``str(error)`` as it is."""

from __future__ import annotations


class AppError(Exception):
    """Base of every error SpecDeck explains to the user: the message says what is wrong and what to do."""


class ModelFileError(AppError):
    """A model file is missing, unreadable or not a usable GGUF."""


class IncompatibleDrafterError(AppError):
    """The drafter cannot speculate for this target (vocabulary mismatch and similar)."""


class SettingsError(AppError):
    """A setting is out of range, NaN or otherwise refused before it reaches llama.cpp."""


class PromptTooLongError(AppError):
    """The prompt does not fit in the context window."""


class EngineLoadError(AppError):
    """llama.cpp refused to load the model or create its context."""


class TemplateError(AppError):
    """A chat template is missing, broken, too slow or tried to escape its sandbox."""


class DownloadError(AppError):
    """A demo model could not be fetched or did not verify."""


class StorageError(AppError):
    """A file SpecDeck writes could not be saved (full disk, permissions)."""
