"""fairlane's Ray Serve application: ingress, fair dispatch, replica deployment, metrics, SLA reports."""
