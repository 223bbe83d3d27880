"""How an upload is refused: :class:`UploadError` carries a sentence for the person who sent
the file (HTTP 422), :class:`UploadTooLarge` one for a file over a limit (HTTP 413)."""

from __future__ import annotations

BINARY_DATA = "The file does not look like a CSV text file (binary data found)."
"""The refusal of a file that holds bytes no text file holds (NUL, many control characters)."""


class UploadError(ValueError):
    """An upload we cannot use. ``detail`` is a sentence for the person who sent it (HTTP 422)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class UploadTooLarge(UploadError):
    """Over the byte or row limit (HTTP 413). A subclass of UploadError: catch it first."""
