"""verimail.testbed."""
