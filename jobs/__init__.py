"""The job service: creating jobs (inspect, store, reserve, submit) and their life in the
store whatever runs them — heartbeat, recovery, deferred retries, webhooks. No Prefect."""
