"""verimail.tasks."""
