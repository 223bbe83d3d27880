"""What the flows do besides verifying and handling files: today, webhooks."""
