"""verimail.store."""
