"""Batches: what submitting one does (``submit``: validation, the idempotency key, enqueue after
commit). The rows are in ``farm.db.batches`` (creation), ``farm.db.dynamic`` (a dynamic batch's
pool) and ``farm.db.reads`` (status and result pages); the routes in ``farm.api.routes.batches``."""
