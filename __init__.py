"""verimail: an email verification service.

The repository root *is* the ``verimail`` package (``package-dir = {"verimail": "."}``
in pyproject.toml), so ``schemas/`` imports as ``verimail.schemas`` and so on.
"""

__version__ = "0.1.0"
API_VERSION = "1.0.0"
