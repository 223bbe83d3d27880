"""verimail.flows: Prefect flows and how they are run.

Prefect's server phones home for analytics by default; verimail runs on machines that
may have no internet, and should not send anything anyway, so it is off unless set.
"""

import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
