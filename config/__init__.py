"""Settings for every part of verimail (``VERIMAIL_*``, pydantic-settings), checked when read.

The picture: ``settings.py`` is :class:`Settings` and the ways to reach it (the process's
:func:`get_settings`; :func:`current_settings` and :func:`using_settings`, the override a
flow run started with explicit settings sees); ``egress.py`` is where SMTP sessions leave
from as the settings read it (the egress file, proxy URLs, HELO names). Callers import the
names from here (``from verimail.config import Settings``), whichever module holds them.
"""

from verimail.config.egress import (
    EgressFile,
    EgressSpec,
    RouteSpec,
    fully_qualified,
    mask_proxy_url,
    proxy_parts,
    read_egress_file,
)
from verimail.config.settings import (
    IPNetwork,
    Settings,
    current_settings,
    get_settings,
    using_settings,
)

__all__ = [
    "EgressFile",
    "EgressSpec",
    "IPNetwork",
    "RouteSpec",
    "Settings",
    "current_settings",
    "fully_qualified",
    "get_settings",
    "mask_proxy_url",
    "proxy_parts",
    "read_egress_file",
    "using_settings",
]
