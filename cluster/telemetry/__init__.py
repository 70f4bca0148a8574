"""What the cluster reports: Prometheus metrics, request timings, SLA reports, process memory."""
