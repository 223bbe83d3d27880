"""Receiving a multipart CSV upload as a stream, with a hard size cap.

Starlette's ``request.form()`` spools a whole file before the endpoint runs, so a 1 GB
upload would be read (and stored) in full before we could refuse it. Here the body is
parsed as it arrives (python-multipart's push parser): the file part goes straight to
disk, and the moment it passes ``upload_max_bytes`` reading stops, the partial file is
deleted and the client gets 413 — the rest of the body is never read. A declared
``Content-Length`` that is already too large is refused before reading anything, and the
whole body (envelope, preamble, epilogue and fields included, not just the file) may not
pass ``max_bytes + ENVELOPE_ALLOWANCE``: junk after the closing boundary is otherwise
skipped by the parser but still read, for as long as a client cares to send it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.exceptions import HTTPException

from verimail.api.errors import ApiError
from verimail.schemas.limits import MAX_FORM_FIELD_LENGTH

MAX_FIELD_BYTES = 4 * MAX_FORM_FIELD_LENGTH  # (UTF-8: the memory bound while it streams)
MAX_PARTS = 16
ENVELOPE_ALLOWANCE = 64 * 1024  # multipart boundaries and part headers around the file


@dataclass
class ReceivedUpload:
    """What a multipart request carried: the file (on disk) and the text fields."""

    path: Path | None = None
    filename: str | None = None
    size: int = 0
    fields: dict[str, str] = field(default_factory=dict)


def _too_large(limit: int) -> ApiError:
    megabytes = limit / (1024 * 1024)
    size = f"{megabytes:.0f} MB" if megabytes >= 1 else f"{limit} bytes"
    return ApiError(413, f"The upload is larger than the limit of {size}; nothing was stored.")


async def receive_upload(
    request: Request, dest: Path, *, max_bytes: int, file_field: str = "file"
) -> ReceivedUpload:
    """Parse the multipart body: ``file_field`` is written to ``dest``, fields kept as text.

    Raises ApiError 413 (too large), 422 (not multipart, no file part, malformed). On any
    error nothing is left on disk.
    """
    content_type = request.headers.get("content-type", "")
    kind, params = parse_options_header(content_type)
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise ApiError(
            422,
            f"Send the CSV as multipart/form-data with the file in a part named `{file_field}`.",
        )
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes + ENVELOPE_ALLOWANCE:
        raise _too_large(max_bytes)

    result = ReceivedUpload()
    state: dict = {"name": None, "filename": None, "header": b"", "value": b"", "headers": {}}
    current: dict = {"out": None, "buf": bytearray(), "parts": 0}
    problem: list[ApiError] = []

    def on_part_begin() -> None:
        current["parts"] += 1
        state["headers"] = {}
        state["name"] = state["filename"] = None
        current["buf"] = bytearray()
        if current["parts"] > MAX_PARTS:
            problem.append(ApiError(422, "The form has too many parts."))

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state["header"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state["value"] += data[start:end]

    def on_header_end() -> None:
        state["headers"][state["header"].lower()] = state["value"]
        state["header"] = state["value"] = b""

    def on_headers_finished() -> None:
        _, disposition = parse_options_header(state["headers"].get(b"content-disposition", b""))
        name = disposition.get(b"name", b"").decode("utf-8", "replace")
        state["name"] = name
        # The part named `file` is the file, with or without a filename: `curl -F
        # "file=<list.csv"` sends none, and `filename*=` alone is dropped by the parser.
        if name == file_field:
            if result.path is not None:
                problem.append(ApiError(422, f"Send exactly one `{file_field}` part."))
                return
            filename = disposition.get(b"filename")
            state["filename"] = filename.decode("utf-8", "replace") if filename else None
            dest.parent.mkdir(parents=True, exist_ok=True)
            current["out"] = dest.open("wb")
            result.path = dest
            result.filename = state["filename"]

    def on_part_data(data: bytes, start: int, end: int) -> None:
        out: BinaryIO | None = current["out"]
        chunk = data[start:end]
        if out is not None:
            result.size += len(chunk)
            if result.size > max_bytes:
                problem.append(_too_large(max_bytes))
                return
            out.write(chunk)
        else:
            current["buf"] += chunk
            if len(current["buf"]) > MAX_FIELD_BYTES:
                problem.append(_field_too_long(state["name"]))

    def on_part_end() -> None:
        out = current["out"]
        if out is not None:
            out.close()
            current["out"] = None
        elif state["name"]:
            text = bytes(current["buf"]).decode("utf-8", "replace")
            if len(text) > MAX_FORM_FIELD_LENGTH:  # (the schema's maxLength, in characters)
                problem.append(_field_too_long(state["name"]))
            result.fields[state["name"]] = text

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
        },
    )
    body_limit = max_bytes + ENVELOPE_ALLOWANCE
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > body_limit:
                raise _too_large(max_bytes)
            parser.write(chunk)
            if problem:
                raise problem[0]
        parser.finalize()
        if problem:
            raise problem[0]
    except (ApiError, HTTPException):  # (HTTPException: the body limit's 408, see body_limit)
        _discard(current, result)
        raise
    except Exception as exc:  # malformed multipart, client went away
        _discard(current, result)
        raise ApiError(422, "The multipart body could not be read; send the form again.") from exc
    if current["out"] is not None:  # body ended inside the file part
        _discard(current, result)
        raise ApiError(422, "The upload ended before the file was complete.")
    if result.path is None:
        raise ApiError(422, f"No file: send the CSV in a form part named `{file_field}`.")
    return result


def _discard(current: dict, result: ReceivedUpload) -> None:
    out = current.get("out")
    if out is not None:
        with contextlib.suppress(Exception):
            out.close()
    if result.path is not None:
        result.path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the folder made for it, if nothing else is there
            result.path.parent.rmdir()


def _field_too_long(name: str) -> ApiError:
    return ApiError(
        422, f"The form field `{name}` is longer than {MAX_FORM_FIELD_LENGTH} characters."
    )


def upload_body(file_description: str, fields: dict[str, str]) -> dict[str, Any]:
    """``openapi_extra`` documenting a multipart form: a required ``file`` plus text fields.

    Needed because the body is parsed by :func:`receive_upload`, not declared as
    FastAPI parameters (which would spool the whole file before the endpoint runs).
    """
    properties: dict[str, Any] = {
        "file": {"type": "string", "format": "binary", "description": file_description}
    }
    for name, description in fields.items():
        properties[name] = {
            "type": "string",
            "maxLength": MAX_FORM_FIELD_LENGTH,
            "description": description,
        }
    schema = {"type": "object", "required": ["file"], "properties": properties}
    return {
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": schema}}}
    }
