"""Concurrent requests of one web process share a message; a lone one goes at once."""

from __future__ import annotations

import threading

from laneway.interactive_protocol import new_request
from webapp.interactive_client import Coalescer


def request(n: int):
    return new_request(["embed"], [], [(str(n), f"text {n}")], keep=False, account=1)


def test_a_lone_request_is_sent_at_once_in_its_own_message():
    sent = []
    c = Coalescer(lambda batch, expires: sent.append(([r.ids[0] for r in batch], expires)))
    c.send(request(1), 2.0)
    c.send(request(2), None)
    assert sent == [(["1"], 2.0), (["2"], None)]


def test_requests_arriving_during_a_send_share_the_next_message():
    first_sending, release = threading.Event(), threading.Event()
    sent: list[list[str]] = []

    def sender(batch, expires):
        sent.append([r.ids[0] for r in batch])
        if len(sent) == 1:
            first_sending.set()
            release.wait(10)

    c = Coalescer(sender)
    leader = threading.Thread(target=c.send, args=(request(0), 5.0))
    leader.start()
    assert first_sending.wait(10)
    for n in range(1, 6):  # they find a send under way: queued, not sent by them
        c.send(request(n), float(n))
    assert sent == [["0"]]
    release.set()
    leader.join(10)
    assert sent == [["0"], ["1", "2", "3", "4", "5"]] and c.messages == 2
    assert not c.sending and not c.pending


def test_a_failed_send_still_sends_what_arrived_meanwhile():
    started, release = threading.Event(), threading.Event()
    sent: list[list[str]] = []

    def sender(batch, expires):
        sent.append([r.ids[0] for r in batch])
        if len(sent) == 1:
            started.set()
            release.wait(10)
            raise ConnectionError("broker away")

    c = Coalescer(sender)
    errors = []

    def lead():
        try:
            c.send(request(0), 1.0)
        except ConnectionError as exc:
            errors.append(exc)

    leader = threading.Thread(target=lead)
    leader.start()
    assert started.wait(10)
    c.send(request(1), 1.0)  # queued behind the failing send
    release.set()
    leader.join(10)
    assert sent == [["0"], ["1"]] and len(errors) == 1 and not c.sending


def test_a_failed_send_does_not_wedge_later_ones():
    calls = []

    def sender(batch, expires):
        calls.append(len(batch))
        if len(calls) == 1:
            raise ConnectionError("broker away")

    c = Coalescer(sender)
    try:
        c.send(request(1), 1.0)
    except ConnectionError:
        pass
    c.send(request(2), 1.0)
    assert calls == [1, 1]
