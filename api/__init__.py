"""verimail.api."""
