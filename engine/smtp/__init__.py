"""The SMTP prober: sessions and domain sessions (``prober``), reply codes (``replies``),
per-host session caps (``host_slots``, held as :mod:`verimail.engine.leases` in Redis)."""
