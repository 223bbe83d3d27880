"""verimail.flows: Prefect flows and how they are run.

Prefect phones home for analytics by default, from its server and from the client (which
also prints a first-run notice in the middle of ``verimail bulk``'s progress bar). verimail
runs on machines that may have no internet, and should not send anything anyway, so both
are off unless set: this package is imported before anything of ours imports Prefect.
"""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
