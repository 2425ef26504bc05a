"""Trials: one harness episode behind the proxy, and its token-exact record.

A trainer (or the harness task type) makes a trial, hands its key and base URL to a harness, and
reads its record afterwards. Everything about them is here:

- ``store``: a trial's life through an ORM session (make with its key, read, end, list its calls);
- ``values``: what a call's start and finish record, and what the proxy reads back;
- ``statements``: a proxy call's statements in SQL (parent, start, finish, failure);
- ``async_statements``: the same statements from the proxy's event loop (PostgreSQL);
- ``recorder``: the one interface the proxy records a call through, and why it has two ways;
- ``record``: the record as a trainer reads it (segments, loss masks, the certificate);
- ``resources``: a worker's trials, opened per RUN attempt (``ctx.trials`` of a handler).

The HTTP routes (``farm.api.routes.trials``) and the proxy (``farm.proxy``) call into this package.
"""
