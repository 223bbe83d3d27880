"""verimail.api.routes."""
