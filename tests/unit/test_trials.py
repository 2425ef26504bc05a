"""A trial's calls against both databases: the start and finish statements the proxy runs per call,
as SQLAlchemy runs them and (PostgreSQL) as the proxy's event loop does (``farm.trials.async_statements``)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import Engine

from farm.config import Settings
from farm.db.session import make_engine, make_session_factory, transaction
from farm.errors import NotFound, TrialEnded, TrialNotFound
from farm.trials import record, statements, store
from farm.trials.async_statements import AsyncTrials
from farm.trials.recorder import CallRecorder, LoopRecorder, ThreadRecorder
from farm.trials.values import CallFinish, CallStart, Parent


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(Settings(), url=db_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(engine: Engine) -> Any:
    return make_session_factory(engine)


@pytest.fixture(params=["sync", "loop"])
def on_loop(
    request: pytest.FixtureRequest, db_url: str
) -> Iterator[tuple[AsyncTrials, asyncio.AbstractEventLoop] | None]:
    """None: the statements through SQLAlchemy; else an AsyncTrials on its loop (PostgreSQL only)."""
    if request.param == "sync":
        yield None
        return
    if not db_url.startswith("postgresql"):
        pytest.skip("the event loop's statements are PostgreSQL's")
    loop = asyncio.new_event_loop()
    db = AsyncTrials(db_url, max_size=2)
    assert loop.run_until_complete(db.here()) is db  # its pools open on this loop
    yield db, loop
    loop.run_until_complete(db.close())
    loop.close()


def _hashes(*texts: str) -> list[bytes]:
    """A chain of 16-byte hashes, one per message, as ``farm.proxy.conversation.chain`` makes."""
    out, previous = [], b"root"
    for text in texts:
        previous = hashlib.blake2b(previous + text.encode(), digest_size=16).digest()
        out.append(previous)
    return out


def _open(sessions: Any) -> str:
    with transaction(sessions) as session:
        trial, _ = store.new_trial(session, trial_id=None, model="m")
        return trial.id


OnLoop = tuple[AsyncTrials, asyncio.AbstractEventLoop] | None


def _start(
    engine: Engine, trial_id: str, hashes: list[bytes], *, ids: tuple[int, ...] = (1, 2), on_loop: OnLoop = None
) -> tuple[int, Any]:
    def start(parent: Any) -> CallStart:
        return CallStart(
            parent=parent,
            wire="openai.chat",
            streamed=False,
            message_hashes=hashes,
            delta_ids=list(ids),
            prompt_tokens=len(ids),
            continuity={"extends": parent.seq if parent else None},
        )

    if on_loop is not None:
        db, loop = on_loop
        parent = loop.run_until_complete(db.find_parent(trial_id, hashes))
        seq = loop.run_until_complete(db.add_call(trial_id, start(parent)))
        if seq is None:  # as the proxy does: the sync function says why
            with engine.connect() as conn:
                statements.raise_closed(conn, trial_id)
        return seq, parent
    with engine.connect() as conn:
        parent = statements.find_parent(conn, trial_id, hashes)
        seq = statements.add_call(conn, trial_id, start(parent))
        conn.commit()
    return seq, parent


def _values(end_hash: bytes, content: str = "ok") -> CallFinish:
    return CallFinish(
        sampled_ids=[7, 8, 9],
        logprobs=[-0.1, -0.2, -0.3],
        finish_reason="stop",
        reply={"content": content, "tool_calls": [], "finish_reason": "stop", "stop_string": None},
        end_hash=end_hash,
        backend_id="b",
        first_token_s=0.01,
        latency_s=0.1,
        weight_versions=[(0, 0, 3)],
    )


def _parent_seq(parent: Any) -> int | None:
    return parent.seq if parent else None


def _finish(
    engine: Engine,
    trial_id: str,
    seq: int,
    parent: Any,
    end_hash: bytes,
    content: str = "ok",
    *,
    on_loop: OnLoop = None,
) -> bool:
    values = _values(end_hash, content)
    if on_loop is not None:
        db, loop = on_loop
        if loop.run_until_complete(db.finish_call(trial_id, seq, values)):
            return True
        # False: a branch or a call no longer pending; the sync function tells which, as in the proxy.
    with engine.begin() as conn:
        return statements.finish_call(conn, trial_id, seq, values, parent_seq=_parent_seq(parent))


def _calls(sessions: Any, trial_id: str) -> list[Any]:
    with sessions() as session:
        return store.calls(session, trial_id)


def test_trials_a_call_that_extends_a_finished_one_finds_it_as_its_parent(
    engine: Engine, sessions: Any, on_loop: OnLoop
) -> None:
    trial_id = _open(sessions)
    user, reply, user2, reply2, user3 = _hashes("u", "a", "u2", "a2", "u3")
    # Its reply holds a NUL: PostgreSQL's JSON text cannot, so the reply is never read in SQL.
    first, _ = _start(engine, trial_id, [user], on_loop=on_loop)
    assert _finish(engine, trial_id, first, None, reply, content="a\x00b", on_loop=on_loop)
    second, parent = _start(engine, trial_id, [user, reply, user2], ids=(3,), on_loop=on_loop)
    assert parent is not None and parent.started_at == _calls(sessions, trial_id)[first].started_at
    assert parent == Parent(
        seq=first,
        segment=0,
        covered=2,
        last_sampled_id=9,
        sampled_tokens=3,
        started_at=parent.started_at,
    )
    assert _finish(engine, trial_id, second, parent, reply2, on_loop=on_loop)
    # The longest covered prefix wins, the latest call among equals.
    third, parent = _start(engine, trial_id, [user, reply, user2, reply2, user3], ids=(4,), on_loop=on_loop)
    assert parent is not None and (parent.seq, parent.covered) == (second, 4)
    with engine.connect() as conn:
        assert statements.end_ids(conn, trial_id, second).tolist() == [1, 2, 7, 8, 9, 3, 7, 8, 9]
    calls = _calls(sessions, trial_id)
    assert [(c.seq, c.segment, c.parent_seq, c.state) for c in calls] == [
        (0, 0, None, "done"),
        (1, 0, 0, "done"),
        (2, 0, 1, "pending"),
    ]
    (segment,) = record.segments(calls)
    assert segment.token_ids.tolist() == [1, 2, 7, 8, 9, 3, 7, 8, 9]
    assert segment.loss_mask.tolist() == [0, 0, 1, 1, 1, 0, 1, 1, 1]


def test_trials_a_second_finished_child_of_one_parent_is_a_branch(
    engine: Engine, sessions: Any, on_loop: OnLoop
) -> None:
    trial_id = _open(sessions)
    user, reply, user2, reply2 = _hashes("u", "a", "u2", "a2")
    first, _ = _start(engine, trial_id, [user], on_loop=on_loop)
    _finish(engine, trial_id, first, None, reply, on_loop=on_loop)
    # Two samples of the same next turn: both start as children in the parent's segment.
    one, parent = _start(engine, trial_id, [user, reply, user2], on_loop=on_loop)
    other, _ = _start(engine, trial_id, [user, reply, user2], on_loop=on_loop)
    assert _finish(engine, trial_id, other, parent, reply2, on_loop=on_loop)
    assert _finish(engine, trial_id, one, parent, reply2, on_loop=on_loop)
    by_seq = {c.seq: c for c in _calls(sessions, trial_id)}
    assert by_seq[other].segment == 0 and "branch" not in by_seq[other].continuity
    assert by_seq[one].segment == 1
    branched = dict(by_seq[one].continuity)
    assert f"call {other} already continued call {first}'s history" in branched.pop("reason")
    assert branched == {"extends": first, "branch": True, "sibling": other}


def test_trials_a_call_of_an_ended_trial_is_refused(engine: Engine, sessions: Any, on_loop: OnLoop) -> None:
    trial_id = _open(sessions)
    (user,) = _hashes("u")
    seq, _ = _start(engine, trial_id, [user], on_loop=on_loop)
    with transaction(sessions) as session:
        store.end(session, trial_id)
    assert not _finish(engine, trial_id, seq, None, b"x" * 16, on_loop=on_loop)
    assert _calls(sessions, trial_id)[0].state == "failed"
    with pytest.raises(TrialEnded):
        _start(engine, trial_id, [user], on_loop=on_loop)
    with pytest.raises(TrialNotFound):
        _start(engine, "no-such-trial", [user], on_loop=on_loop)


def _two_children(engine: Engine, sessions: Any, db_url: str) -> tuple[str, int, int, int, CallFinish]:
    """A trial (PostgreSQL) whose finished first call has two pending children: the trial, the
    children's seqs, their parent's seq and their finish's values."""
    if not db_url.startswith("postgresql"):
        pytest.skip("the event loop's statements are PostgreSQL's")
    trial_id = _open(sessions)
    user, reply, user2, reply2 = _hashes("u", "a", "u2", "a2")
    first, _ = _start(engine, trial_id, [user])
    _finish(engine, trial_id, first, None, reply)
    one, parent = _start(engine, trial_id, [user, reply, user2])
    other, _ = _start(engine, trial_id, [user, reply, user2])
    return trial_id, one, other, parent.seq, _values(reply2)


def test_trials_siblings_finishing_at_once_without_the_lock_make_a_branch(
    engine: Engine, sessions: Any, db_url: str
) -> None:
    """The event loop's finish takes no lock: a sibling that commits while it runs is caught by the
    unique index, and the sync finish then branches the call, as if it had come second."""
    trial_id, one, other, parent_seq, values = _two_children(engine, sessions, db_url)
    loop = asyncio.new_event_loop()
    db = AsyncTrials(db_url, max_size=2)
    try:
        loop.run_until_complete(db.here())
        with engine.connect() as conn:
            pending = conn.begin()
            # under the lock, not committed yet
            assert statements.finish_call(conn, trial_id, other, values, parent_seq=parent_seq)
            racing = loop.create_task(db.finish_call(trial_id, one, values))
            loop.run_until_complete(asyncio.sleep(0.5))
            assert not racing.done()  # its check passed; its update waits on the index for the sibling
            pending.commit()
        assert loop.run_until_complete(racing) is False
        with engine.begin() as conn:
            assert statements.finish_call(conn, trial_id, one, values, parent_seq=parent_seq)
    finally:
        loop.run_until_complete(db.close())
        loop.close()
    by_seq = {c.seq: c for c in _calls(sessions, trial_id)}
    assert (by_seq[other].segment, by_seq[other].state) == (0, "done")
    assert (by_seq[one].segment, by_seq[one].state) == (1, "done")
    assert by_seq[one].continuity["sibling"] == other


def test_trials_a_sync_finish_that_loses_a_race_to_the_loop_branches(
    engine: Engine, sessions: Any, db_url: str
) -> None:
    """The other way round: the sibling on the loop commits while the sync finish (under the lock)
    runs its update; the index refuses it inside a savepoint and the same transaction branches."""
    trial_id, one, other, parent_seq, values = _two_children(engine, sessions, db_url)
    finished = statements.finished_params(values)
    with engine.connect() as loop_side, engine.connect() as conn:
        # The loop's one statement, held open: it has updated its row and not committed.
        racing = loop_side.begin()
        assert loop_side.execute(statements.FINISH, {"_trial_id": trial_id, "_seq": other, **finished}).first()
        done: list[bool] = []

        def finish() -> None:
            with conn.begin():
                done.append(statements.finish_call(conn, trial_id, one, values, parent_seq=parent_seq))

        worker = threading.Thread(target=finish)
        worker.start()
        worker.join(0.5)
        assert worker.is_alive()  # its update waits on the index for the sibling
        racing.commit()
        worker.join(10)
        assert done == [True]
    by_seq = {c.seq: c for c in _calls(sessions, trial_id)}
    assert (by_seq[other].segment, by_seq[one].segment) == (0, 1)
    assert by_seq[one].continuity["sibling"] == other


@pytest.fixture(params=["thread", "loop"])
def recorder(
    request: pytest.FixtureRequest, engine: Engine, db_url: str
) -> Iterator[tuple[CallRecorder, asyncio.AbstractEventLoop]]:
    """Each ``CallRecorder`` the proxy may have, on an event loop of its own."""
    if request.param == "loop" and not db_url.startswith("postgresql"):
        pytest.skip("the event loop's statements are PostgreSQL's")
    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor(max_workers=2)
    threads = ThreadRecorder(durable=engine, early=None, executor=executor)
    made: CallRecorder = (
        threads if request.param == "thread" else LoopRecorder(AsyncTrials(db_url, max_size=2), threads)
    )
    yield made, loop
    loop.run_until_complete(made.close())
    loop.close()
    executor.shutdown()


def _call(hashes: list[bytes], parent: Parent | None) -> CallStart:
    return CallStart(
        parent=parent,
        wire="openai.chat",
        streamed=True,
        message_hashes=hashes,
        delta_ids=[1, 2],
        prompt_tokens=2,
        continuity={"extends": parent.seq if parent else None},
    )


def test_trials_recorder_records_a_conversation_its_branch_and_its_failure(
    sessions: Any, recorder: tuple[CallRecorder, asyncio.AbstractEventLoop]
) -> None:
    made, loop = recorder
    run = loop.run_until_complete
    trial_id = _open(sessions)
    user, reply, user2, reply2, user3 = _hashes("u", "a", "u2", "a2", "u3")

    # Given a first call, whose new segment the record explains
    def explain(latest: Any) -> dict[str, Any]:
        return {"extends": None, "reason": "first call" if latest is None else "?"}

    first = run(made.start(trial_id, _call([user], None), explain=explain))
    assert run(made.finish(trial_id, first, lambda: _values(reply), parent_seq=None))
    # When two calls continue it and both finish
    parent = run(made.find_parent(trial_id, [user, reply, user2]))
    assert parent is not None and parent.seq == first
    one = run(made.start(trial_id, _call([user, reply, user2], parent)))
    other = run(made.start(trial_id, _call([user, reply, user2], parent)))
    assert run(made.finish(trial_id, one, lambda: _values(reply2), parent_seq=first))
    assert run(made.finish(trial_id, other, lambda: _values(reply2), parent_seq=first))
    # And a third fails after the harness saw part of its answer
    third = run(made.start(trial_id, _call([user, reply, user2, reply2, user3], None)))
    run(made.fail(trial_id, third, "boom", seen=True))
    # Then the second to finish branched off, and the record is incomplete
    by_seq = {c.seq: c for c in _calls(sessions, trial_id)}
    assert by_seq[first].continuity == {"extends": None, "reason": "first call"}
    assert [(by_seq[s].segment, by_seq[s].state) for s in (one, other, third)] == [
        (0, "done"),
        (1, "done"),
        (2, "failed"),
    ]
    assert by_seq[other].continuity["sibling"] == one
    with sessions() as session:
        assert "call 3 streamed part of an answer" in (store.get(session, trial_id).incomplete or "")
        store.end(session, trial_id)
        session.commit()
    # A closed trial's start says why
    with pytest.raises(TrialEnded):
        run(made.start(trial_id, _call([user], None)))
    with pytest.raises(TrialNotFound):
        run(made.start("no-such-trial", _call([user], None)))


def test_trials_a_trial_of_a_job_that_does_not_exist_is_refused(sessions: Any) -> None:
    with pytest.raises(NotFound, match="no job 424242"), transaction(sessions) as session:
        store.new_trial(session, trial_id=None, model="m", job_id=424242)
