"""Weight updates between training steps: pause the backends, load new weights, resume at a new version.

- ``coordinator``: ``WeightUpdater``, the steps the trainer drives (``/v1/weights``) and the
  background re-drive that finishes an update a dead API process left owed
- ``rows``: the update's record in PostgreSQL, written before each step acts

The API's routes (``farm.api.routes.weights``) only call the coordinator.
"""
