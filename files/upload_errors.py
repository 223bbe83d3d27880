"""How an upload is refused: :class:`UploadError` carries a sentence for the person who sent
the file (HTTP 422), :class:`UploadTooLarge` one for a file over a limit (HTTP 413)."""

from __future__ import annotations

from collections.abc import Mapping

BINARY_DATA = "The file does not look like a CSV text file (binary data found)."
"""The refusal of a file that holds bytes no text file holds (NUL, many control characters)."""


class UploadError(ValueError):
    """An upload we cannot use. ``detail`` is a sentence for the person who sent it (HTTP 422).

    ``detail`` is worded for the API, whose form fields choose columns (``email_column``,
    ``domain_column`` …). The dashboard and the command line have no such fields, so a refusal
    that names them also keeps its parts apart: ``fields``, the API fields it names, and
    ``advice``, its closing "Pass … to choose it." sentence; :meth:`reworded` gives the
    sentence for a surface with other names (issue 36: the CLI said ``domain_column``).
    """

    def __init__(self, detail: str, *, advice: str = "", fields: tuple[str, ...] = ()) -> None:
        full = f"{detail} {advice}" if advice else detail
        super().__init__(full)
        self.detail = full
        self.base = detail
        self.advice = advice
        self.fields = fields

    def reworded(self, names: Mapping[str, str], advice: str | None = None) -> str:
        """The detail for a surface that calls each API field of ``fields`` ``names[field]``
        (a field it lacks: absent), its closing advice replaced by ``advice`` (None: the
        advice reworded the same way; "": none)."""
        text = self.base
        closing = self.advice if advice is None else advice
        for field in self.fields:
            if field in names:
                text = text.replace(field, names[field])
                if advice is None:
                    closing = closing.replace(field, names[field])
        return f"{text} {closing}" if closing else text


class UploadTooLarge(UploadError):
    """Over the byte or row limit (HTTP 413). A subclass of UploadError: catch it first."""
