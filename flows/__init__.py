"""verimail.flows."""
