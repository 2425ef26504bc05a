"""The job state machine: every write that moves a job, and the statements they run.

A job's ``state`` names the stage that owns it; ``stage_done`` says whether that stage is still
running (false, a lease held by one worker) or has finished and the next one is owed (true,
``lease_until`` then being when the reconciler sends the owed message again)::

    queued,done ──claim INIT──> init,running ──complete──> init,done
    init,done   ──claim RUN───> run,running  ──complete──> run,done
    run,done    ──claim EVAL──> eval,running ──complete──> done

    any running stage ──retry_stage──> the same state, running with no owner until ``lease_until``
                                       (its message re-sent; any worker may claim it)
                      ──fail_stage───> failed
    a lapsed lease    ──expired_leases (the sweeper)──> the same: no owner, message re-sent
    any live job      ──cancel_batch─> cancelled
    RUN ending with nothing to score (a cancel, a broken sandbox) ──complete──> done

Which module moves each:

- ``claims``: ``claim_next`` (one conditional UPDATE, the usual case) and ``claim_stage`` (under
  the row lock: a re-delivered message, a lapsed lease, the last attempt, a stale message).
- ``completions``: ``complete_next`` (one guarded statement) and ``complete_stage`` (the locking
  path for an attempt this worker no longer holds as claimed). A completion that ends the job
  takes its ``finish_seq`` in the same statement.
- ``lifecycle``: lease renewal, ``retry_stage``, ``fail_stage``, ``cancel_batch``,
  ``expired_leases``.
- ``jobrows``: the row under all of them: locking, legal moves, finish positions in the batch.
- ``attempts``: what an attempt leaves besides the job row (its ``stage_runs`` row, RUN's
  trajectory).
- ``statements``: the SQL of the above, built once.

Batches are created by ``farm.db.batches.create_batch``; a lost node's jobs are started over or
failed by ``farm.db.nodes``; owed messages are found by ``farm.db.owed``.
"""
