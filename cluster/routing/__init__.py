"""Routing and dispatch: admission, the fair queue's dispatcher, replica choice, tenancy sync."""
