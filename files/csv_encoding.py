"""The text of an upload: which encoding it is in, read exactly (so the results file keeps
every original byte), and files people upload by mistake refused by their signature.

UTF-8 (BOM optional), UTF-16 LE/BE (with BOM, or without one when every other byte is NUL),
else Windows-1252, else Latin-1. Decoding and re-encoding are exact.
"""

from __future__ import annotations

import codecs
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from verimail.files.upload_errors import BINARY_DATA, UploadError

if TYPE_CHECKING:
    from verimail.files.csv_detect import CsvInfo

_CHUNK = 1 << 20

_BOMS: dict[str, bytes] = {
    "utf-8": codecs.BOM_UTF8,
    "utf-16-le": codecs.BOM_UTF16_LE,
    "utf-16-be": codecs.BOM_UTF16_BE,
}

# Signatures of files people upload by mistake; named so the message can say what it is.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG", "a PNG image"),
    (b"GIF8", "a GIF image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "an Excel workbook or a ZIP archive; save the sheet as CSV first"),
    (b"\xd0\xcf\x11\xe0", "an Excel or Office document; save the sheet as CSV first"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"\x28\xb5\x2f\xfd", "a Zstandard archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
)
_CP1252_UNDEFINED = re.compile(rb"[\x81\x8d\x8f\x90\x9d]")


def codec_errors(encoding: str) -> str:
    """Error handler that makes decode→encode exact (UTF-16 with lone surrogates is refused
    at inspection, so ``surrogatepass`` only keeps this exact should one get through)."""
    return "surrogatepass" if encoding.startswith("utf-16") else "strict"


def bom_bytes(info: CsvInfo) -> bytes:
    """The BOM to write before the text (empty when the file had none)."""
    return _BOMS[info.encoding] if info.has_bom else b""


def _guess_utf16(head: bytes) -> str | None:
    """UTF-16 without BOM: mostly-ASCII text has a NUL in every other byte."""
    n = len(head) - len(head) % 2
    if n < 4:
        return None
    half = n // 2
    even_nuls, odd_nuls = head[0:n:2].count(0), head[1:n:2].count(0)
    if odd_nuls >= 0.3 * half and even_nuls <= 0.02 * half:
        return "utf-16-le"
    if even_nuls >= 0.3 * half and odd_nuls <= 0.02 * half:
        return "utf-16-be"
    return None


def _chunks(path: Path, data: bytes | None, skip: int = 0) -> Iterator[bytes]:
    """The bytes from ``skip`` on in 1 MiB pieces (of ``data`` when the file was read whole):
    decoding piece by piece never builds the whole text."""
    if data is not None:
        for start in range(skip, len(data), _CHUNK):
            yield data[start : start + _CHUNK]
        return
    with path.open("rb") as f:
        f.seek(skip)
        while chunk := f.read(_CHUNK):
            yield chunk


def detect_encoding(path: Path, data: bytes | None = None) -> tuple[str, bool]:
    """(codec, has_bom) for the whole file; raises UploadError for empty or binary files.

    Reads the whole file (``data`` when the caller already has it, else 1 MiB chunks): a stray
    non-UTF-8 byte near the end must switch the codec, or that row could not be written back
    unchanged.
    """
    if data is not None:
        head = data[:4096]
    else:
        with path.open("rb") as f:
            head = f.read(4096)
    if not head:
        raise UploadError("The file is empty.")
    for magic, what in _MAGIC:
        if head.startswith(magic):
            raise UploadError(
                f"The file does not look like a CSV text file (it looks like {what})."
            )
    for encoding in ("utf-16-le", "utf-16-be", "utf-8"):
        if head.startswith(_BOMS[encoding]):
            has_bom = True
            break
    else:
        has_bom = False
        encoding = _guess_utf16(head) or "utf-8"
    skip = len(_BOMS[encoding]) if has_bom else 0
    if encoding.startswith("utf-16"):
        _check_utf16(path, data, encoding, skip)
        return encoding, has_bom
    return _check_8bit(path, data, has_bom)


def _check_utf16(path: Path, data: bytes | None, encoding: str, skip: int) -> None:
    """Strict: a lone surrogate is refused here. It cannot be stored as UTF-8 (Polars, the
    database), so a file holding one was accepted and charged, then failed its job."""
    decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
    offset = skip
    try:
        for chunk in _chunks(path, data, skip):
            if "\x00" in decoder.decode(chunk):
                raise UploadError(BINARY_DATA)
            offset += len(chunk)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        if "surrogate" in exc.reason or "illegal" in exc.reason:
            at = offset + exc.start
            raise UploadError(
                f"The file looks like UTF-16 text but holds a broken character (an unpaired "
                f"surrogate) at byte {at:,}; save it again as UTF-8 or UTF-16."
            ) from None
        raise UploadError(
            "The file looks like UTF-16 text but is not valid UTF-16 (it may be cut off)."
        ) from None


def _check_8bit(path: Path, data: bytes | None, has_bom: bool) -> tuple[str, bool]:
    """UTF-8 if every byte decodes, else Windows-1252 if it has no undefined byte, else Latin-1."""
    if data is not None and b"\x00" not in data and data.isascii():
        return "utf-8", has_bom  # (two scans of the bytes, where the chunks below copy them)
    utf8 = codecs.getincrementaldecoder("utf-8")()
    utf8_ok = True
    for chunk in _chunks(path, data):
        if b"\x00" in chunk:
            raise UploadError(BINARY_DATA)
        # ASCII with nothing pending decodes as it is: skip building the text (10x faster).
        if utf8_ok and not (chunk.isascii() and not utf8.getstate()[0]):
            try:
                utf8.decode(chunk)
            except UnicodeDecodeError:
                utf8_ok = False
    if utf8_ok:
        try:
            utf8.decode(b"", final=True)
            return "utf-8", has_bom
        except UnicodeDecodeError:
            pass
    # Not UTF-8; a UTF-8 "BOM" before it was not one: those bytes stay in the text as characters.
    for chunk in _chunks(path, data):
        if _CP1252_UNDEFINED.search(chunk):
            return "latin-1", False
    return "cp1252", False


def open_text(path: Path, encoding: str, has_bom: bool) -> TextIO:
    """The file's text after the BOM, line endings untouched (``newline=""``)."""
    raw = path.open("rb", buffering=_CHUNK)
    if has_bom:
        raw.seek(len(_BOMS[encoding]))
    return io.TextIOWrapper(raw, encoding=encoding, errors=codec_errors(encoding), newline="")


def open_info(path: Path, info: CsvInfo) -> TextIO:
    """:func:`open_text` for an inspected file."""
    return open_text(path, info.encoding, info.has_bom)
