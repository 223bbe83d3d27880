"""The SMTP prober (``prober``) and what it is made of: the records it hands out
(``findings``), one session's connection and transaction (``session``), a host group's run
(``group_run``), the finder's session to one domain (``domain_session``), reply codes
(``replies``) and per-host session caps (``host_slots``, held as :mod:`verimail.engine.leases`
in Redis)."""
