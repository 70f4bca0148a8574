"""The HTTP edge: the OpenAI ingress, request schemas, responses and errors on the wire."""
