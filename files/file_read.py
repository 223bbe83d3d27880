"""A whole file's bytes, read by two threads at once.

Reading a 100 MB upload into a fresh ``bytes`` object is mostly the kernel faulting in and
filling new pages, on one core: 0.04 s for 86 MB on the benchmark VM. ``os.preadv``
releases the GIL, so two threads filling the two halves take about half that (0.021 s), and
each faults its half in with one ``madvise`` call first (0.0175 s).

The result is ``bytes`` because that is what Polars reads without copying. It is made the way
the C API makes a ``bytes`` object to be filled in place (``PyBytes_FromStringAndSize(NULL,
n)``, here through ``ctypes``), and nothing else sees it until it is full. Where that is not
available, or the file changes size while it is read, a plain read is the answer.
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PARALLEL_MIN = 8 << 20  # below this one read costs as little as starting a thread

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_POPULATE_WRITE = 23  # Linux 5.14+; elsewhere madvise fails and the faults happen as usual

try:
    _madvise = ctypes.CDLL(None, use_errno=True).madvise
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
except (AttributeError, OSError):  # no libc madvise
    _madvise = None

try:
    _new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
    _new_bytes.restype = ctypes.py_object
    _new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
    _address_of = ctypes.pythonapi.PyBytes_AsString
    _address_of.restype = ctypes.c_void_p
    _address_of.argtypes = (ctypes.py_object,)
except AttributeError:  # not CPython
    _new_bytes = None


class _SizeChanged(Exception):
    """The file was shorter or longer than when it was measured."""


def _populate(address: int, size: int) -> bool:
    """Fault in the whole pages of ``address``..``address + size`` in one call
    (``MADV_POPULATE_WRITE``; their contents stay as they are), which costs less than a fault
    per page as ``preadv`` fills them: 0.022 s → 0.0175 s for 86 MB. A kernel without it
    refuses (False), and the pages fault in as usual."""
    start = -(-address // _PAGE) * _PAGE
    end = (address + size) // _PAGE * _PAGE
    if _madvise is None or end <= start:
        return False
    return _madvise(start, end - start, _MADV_POPULATE_WRITE) == 0


def _fill(fd: int, view: memoryview, offset: int, address: int) -> None:
    """``view`` (at ``address``) filled from the file at ``offset``; raises _SizeChanged at a
    premature end."""
    _populate(address, len(view))
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise _SizeChanged
        done += got


def read_file(path: Path) -> bytes:
    """The file's bytes (``path.read_bytes()``), the two halves of a large file read at once."""
    with path.open("rb", buffering=0) as f:
        fd = f.fileno()
        size = os.fstat(fd).st_size
        if size < PARALLEL_MIN or _new_bytes is None:
            return f.read()
        data: bytes = _new_bytes(None, size)
        address = _address_of(data)
        view = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
        half = size // 2
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="file-read") as pool:
                second = pool.submit(_fill, fd, view[half:], half, address + half)
                _fill(fd, view[:half], 0, address)
                second.result()
            if os.pread(fd, 1, size):
                raise _SizeChanged
        except _SizeChanged:
            return path.read_bytes()
        finally:
            view.release()
        return data
