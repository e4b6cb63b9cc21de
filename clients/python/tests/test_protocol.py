"""The protocol rules, without a server."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import deadbolt
from deadbolt import _protocol as protocol
from deadbolt._errors import _BY_KIND, error_for


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", 30.0),
        ("500ms", 0.5),
        ("1m30s", 90.0),
        ("2h", 7200.0),
        ("1.5s", 1.5),
        ("1d", 86400.0),
    ],
)
def test_durations_read_as_people_write_them(text: str, expected: float) -> None:
    assert protocol.seconds(text) == expected


def test_durations_also_take_numbers_and_timedeltas() -> None:
    assert protocol.seconds(2) == 2.0
    assert protocol.seconds(timedelta(milliseconds=250)) == 0.25


@pytest.mark.parametrize("bad", ["", "30", "thirty seconds", "5x", "-1s", True, None])
def test_a_bad_duration_is_refused_saying_how_to_write_one(bad: object) -> None:
    with pytest.raises(deadbolt.InvalidArgument):
        protocol.seconds(bad)  # type: ignore[arg-type]


def test_renewal_counts_from_the_send_time_and_never_shortens_the_lease() -> None:
    assert protocol.renewed_deadline(current=9.0, sent=3.0, granted=9.0) == 12.0
    assert protocol.renewed_deadline(current=9.0, sent=1.0, granted=3.0) == 9.0


def test_attempt_ids_strictly_increase() -> None:
    ids = [protocol.next_attempt() for _ in range(1000)]
    assert all(later > earlier for earlier, later in zip(ids, ids[1:]))


def test_backoff_has_full_jitter_under_a_growing_ceiling_and_a_cap() -> None:
    backoff = protocol.Backoff(base=0.05, cap=1.0)
    delays = [backoff.next_delay() for _ in range(40)]
    assert all(0.0 <= delay <= 1.0 for delay in delays)
    assert delays[0] <= 0.05
    assert max(delays[10:]) > 0.05  # grew past the first ceiling


def test_every_server_error_kind_has_its_exception_with_the_message() -> None:
    kinds = [
        "unknown_session", "busy", "not_holder", "stale_token", "invalid_argument",
        "limit_reached", "wait_timeout", "wait_cancelled", "session_expiring", "not_leader",
        "unavailable", "overloaded", "internal", "permission_denied", "unauthenticated",
        "needs_upgrade", "compacted",
    ]  # fmt: skip
    assert sorted(_BY_KIND) == sorted(kinds)
    for kind in kinds:
        error = error_for(kind, f"the server's words about {kind}")
        assert error.kind == kind
        assert str(error) == f"the server's words about {kind}"
        assert type(error) is not deadbolt.DeadboltError
    assert isinstance(error_for("busy", "x"), deadbolt.LockBusy)
    assert isinstance(error_for("wait_timeout", "x"), TimeoutError)
    assert isinstance(error_for("session_expiring", "x"), deadbolt.LeaseLost)


def test_an_error_answer_raises_its_kind_with_the_leader_and_retry_after() -> None:
    body = b'{"error":{"kind":"not_leader","message":"ask node 2","leader":"10.0.0.2:7070"}}'
    with pytest.raises(deadbolt.NotLeader) as not_leader:
        protocol.parse_answer(503, body, None)
    assert not_leader.value.leader == "10.0.0.2:7070"
    body = b'{"error":{"kind":"overloaded","message":"queue full"}}'
    with pytest.raises(deadbolt.Overloaded) as overloaded:
        protocol.parse_answer(503, body, "1")
    assert overloaded.value.retry_after == 1.0


def test_a_reply_that_is_not_deadbolts_says_so() -> None:
    with pytest.raises(deadbolt.Unavailable, match="not from a Deadbolt server"):
        protocol.parse_answer(502, b"<html>Bad Gateway</html>", None)


def test_an_answer_is_read_as_json_loads_reads_it() -> None:
    for body in (b'{"token":7}', b' {"token":7}\n', b"{}\r\n", b""):
        assert protocol.parse_answer(200, body, None) == ({"token": 7} if b"7" in body else {})
    for body in (b'{"token":7}{"token":8}', b'{"token":', b"[1]", b"null"):
        with pytest.raises(deadbolt.Internal, match="not from a Deadbolt server"):
            protocol.parse_answer(200, body, None)


def test_not_leader_moves_to_the_leader_it_names_and_unreachable_to_the_next() -> None:
    endpoints = protocol.Endpoints.parse("10.0.0.1:7070, 10.0.0.2", tls=False)
    assert endpoints.urls == ["http://10.0.0.1:7070", "http://10.0.0.2:7070"]
    first = endpoints.url()
    endpoints.failed(first, deadbolt.NotLeader("no", leader="10.0.0.3:7070"))
    assert endpoints.url() == "http://10.0.0.3:7070"
    endpoints.failed("http://10.0.0.3:7070", deadbolt.Unavailable("down"))
    assert endpoints.url() == "http://10.0.0.1:7070"
    # A failure reported late, for an endpoint already left, changes nothing.
    endpoints.failed("http://10.0.0.3:7070", deadbolt.Unavailable("down"))
    assert endpoints.url() == "http://10.0.0.1:7070"


def test_a_handle_never_shows_its_secret_in_repr() -> None:
    handle = protocol.SessionHandle(12, "9f8e7d")
    assert "9f8e7d" not in repr(handle)
    assert str(handle) == "12.9f8e7d"
    assert protocol.SessionHandle.parse("12.9f8e7d") == handle


def test_an_answer_with_a_malformed_integer_is_refused_not_read_as_a_number() -> None:
    state = {"name": "a", "holder_session_id": 3, "token": 7}
    status = protocol.LockStatus.parse({"state": state, "index": 9})
    assert status is not None and (status.token, status.index) == (7, 9)
    left_out = protocol.LockStatus.parse({"state": {"name": "a"}})
    assert left_out is not None and (left_out.token, left_out.holder) == (0, 0)
    for bad in (-5, True, "7", 1.5):
        with pytest.raises(deadbolt.Internal, match="unsigned integer"):
            protocol.LockStatus.parse({"state": {**state, "token": bad}, "index": 9})


def test_a_call_is_attempted_until_its_own_deadline() -> None:
    # Not given up a backoff step early: the last attempts come closer and
    # closer to the deadline.
    started = protocol.now()
    retry = protocol.Retry(give_up=started + 0.5)
    with pytest.raises(deadbolt.NotLeader):
        while True:
            time.sleep(retry.delay_after(deadbolt.NotLeader("no leader yet")))
    assert 0.48 < protocol.now() - started < 0.6


def test_only_a_sent_request_with_no_answer_has_an_unknown_outcome() -> None:
    sent = deadbolt.Unavailable("no answer")
    unsent = deadbolt.Unavailable("refused")
    unsent.unsent = True
    assert protocol.outcome_unknown(sent)
    assert not protocol.outcome_unknown(unsent)
    assert not protocol.outcome_unknown(deadbolt.NotLeader("no leader yet"))
    release = protocol.Retry(done="not_holder", changes=True)
    release.delay_after(unsent)
    assert not release.went_through(deadbolt.NotHolder("not holder"))
    release.delay_after(sent)
    assert release.went_through(deadbolt.NotHolder("not holder"))


def test_a_change_refused_after_an_unknown_outcome_has_an_unknown_outcome() -> None:
    cut_off = deadbolt.Unavailable("the forwarding node may or may not have done it")
    put = protocol.Retry(changes=True)
    put.delay_after(deadbolt.NotLeader("no leader yet"))
    put.delay_after(cut_off)
    with pytest.raises(deadbolt.Unavailable, match="may have been done") as raised:
        put.delay_after(deadbolt.StaleToken("token 3 is below the fence 4"))
    assert raised.value.outcome_unknown and "token 3" in str(raised.value)
    # A lost session is the answer whatever the first attempt did; a read
    # changes nothing, so its refusal is the truth.
    with pytest.raises(deadbolt.UnknownSession):
        put.delay_after(deadbolt.UnknownSession("no session 7"))
    read = protocol.Retry()
    read.delay_after(cut_off)
    with pytest.raises(deadbolt.NotHolder):
        read.delay_after(deadbolt.NotHolder("not holder"))


def test_a_failover_is_retried_within_a_quarter_second_and_an_overload_within_a_second() -> None:
    # Issue 59: a pause of up to a second after an election made callers
    # wait for nothing; an overloaded leader still gets the longer spread.
    for error, cap in [
        (error_for("not_leader", "x"), protocol.FAILOVER_CAP),
        (error_for("unavailable", "x"), protocol.FAILOVER_CAP),
        (error_for("overloaded", "x"), protocol.BACKOFF_CAP),
    ]:
        retry = protocol.Retry()
        delays = [retry.delay_after(error) for _ in range(200)]
        assert all(0.0 <= delay <= cap for delay in delays)
        assert max(delays) > cap / 2
    assert protocol.FAILOVER_CAP < protocol.BACKOFF_CAP


def test_a_renewal_answered_within_the_margin_does_not_revive_the_lease() -> None:
    # The Go client's frozen-server test found it: an answer that came once
    # `lost` had fired renewed the lease, and `lost` read None again.
    lease = protocol.Lease(session_id=7, deadline=protocol.now() + 1.0)
    assert not lease.renewed(sent=protocol.now(), granted=30.0, margin=2.0)
    assert lease.lost_reason(2.0) is not None
    assert lease.renewed(sent=protocol.now(), granted=30.0, margin=0.5)
    assert lease.lost_reason(2.0) is None
