"""Refusals as exceptions, and the retry policy against real 429s, 503s and lost connections."""

from __future__ import annotations

import time
import uuid

import pytest

from conftest import FAST_RETRY, KEYS, MAX_REQUEST_BYTES, PHOTOS, DroppingProxy, Server
from jointspace_client import (
    NO_RETRY,
    Client,
    Conflict,
    ConnectionFailed,
    Forbidden,
    IdempotencyKeyReused,
    JointspaceError,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RetryEvent,
    RetryPolicy,
    Unauthorized,
    Unavailable,
    image_bytes,
)


def test_401_without_or_with_a_wrong_key(server: Server) -> None:
    for key in (None, "not-a-key-of-this-server"):
        with Client(server.url, api_key=key) as c, pytest.raises(Unauthorized) as e:
            c.list_collections()
        assert (e.value.status, e.value.code) == (401, "unauthorized")
    # Probes need no key.
    with Client(server.url) as c:
        assert c.ready()["ready"] is True


def test_403_for_a_role_or_a_collection_the_key_lacks(server: Server, admin: Client, collection: str) -> None:
    with Client(server.url, api_key=KEYS["read"]) as reader:
        assert reader.get_collection(collection)["name"] == collection
        with pytest.raises(Forbidden) as e:
            reader.add_image(collection, PHOTOS[0])
        assert (e.value.status, e.value.code) == (403, "forbidden")
    with Client(server.url, api_key=KEYS["writer"]) as writer:
        assert writer.add_image(collection, PHOTOS[0])["id"] > 0
        with pytest.raises(Forbidden):
            writer.create_collection("t-" + uuid.uuid4().hex[:8])
    with Client(server.url, api_key=KEYS["shop-a"]) as shop_a, pytest.raises(Forbidden):
        shop_a.list_images(collection)


def test_404_409_and_a_message_from_the_server(admin: Client, collection: str) -> None:
    with pytest.raises(NotFound) as e:
        admin.get_image(collection, 987654321)
    assert e.value.status == 404 and e.value.message and e.value.request_id
    admin.add_image(collection, PHOTOS[0], external_id="once")
    with pytest.raises(Conflict) as c:
        admin.add_image(collection, PHOTOS[1], external_id="once")
    assert (c.value.status, c.value.code) == (409, "conflict") and "once" in c.value.message
    assert isinstance(c.value, JointspaceError)


def test_413_over_the_body_limit(admin: Client, collection: str) -> None:
    big = image_bytes(PHOTOS[0].read_bytes() + b"\0" * MAX_REQUEST_BYTES, "big.png")
    with pytest.raises(PayloadTooLarge) as e:
        admin.add_image(collection, big)
    assert (e.value.status, e.value.code) == (413, "payload_too_large")
    assert str(MAX_REQUEST_BYTES) in e.value.message
    assert admin.get_collection(collection)["images"] == 0


def test_idempotency_key_replays_and_refuses_another_body(admin: Client, collection: str) -> None:
    key = "client-test-" + uuid.uuid4().hex
    first = admin.add_image(collection, PHOTOS[0], external_id="idem", idempotency_key=key)
    again = admin.add_image(collection, PHOTOS[0], external_id="idem", idempotency_key=key)
    assert again == first  # the first answer, replayed: no second image, no 409 for the external id
    assert admin.get_collection(collection)["images"] == 1
    with pytest.raises(IdempotencyKeyReused) as e:
        admin.add_image(collection, PHOTOS[1], external_id="other", idempotency_key=key)
    assert (e.value.status, e.value.code) == (422, "idempotency_key_reused")
    ids = admin.add_captions(collection, ["a dog"], idempotency_key=key + "-c")["ids"]
    assert admin.add_captions(collection, ["a dog"], idempotency_key=key + "-c")["ids"] == ids
    assert admin.list_captions(collection)["total"] == 1


def test_429_retried_after_retry_after_then_succeeds(server: Server, admin: Client, collection: str) -> None:
    events: list[RetryEvent] = []
    with Client(server.url, api_key=KEYS["limited"], retry=FAST_RETRY, on_retry=events.append) as c:
        c.get_collection(collection)  # takes the bucket's one token
        start = time.monotonic()
        # Refused at once, then retried. (A request without a body: a 429 sent before a body was read can be
        # lost as a reset connection, README "Retries", and then the client waits its backoff instead.)
        page = c.list_images(collection)
        waited = time.monotonic() - start
    assert [(e.status, e.code) for e in events] == [(429, "rate_limited")]
    assert events[0].delay >= 1  # the server's Retry-After
    assert waited >= 0.9
    assert page["total"] == 0


def test_429_past_the_budget_raises_rate_limited_without_waiting(server: Server, collection: str) -> None:
    events: list[RetryEvent] = []
    budget = RetryPolicy(max_attempts=5, max_seconds=5)
    with Client(server.url, api_key=KEYS["slow"], retry=budget, on_retry=events.append) as c:
        c.get_collection(collection)
        start = time.monotonic()
        with pytest.raises(RateLimited) as e:
            c.get_collection(collection)
        assert time.monotonic() - start < 2  # Retry-After (~20 s) is past the budget: not waited for
    assert (e.value.status, e.value.code) == (429, "rate_limited")
    assert e.value.retry_after is not None and e.value.retry_after > 5
    assert events == []
    with Client(server.url, api_key=KEYS["slow"], retry=NO_RETRY) as c, pytest.raises(RateLimited):
        c.get_collection(collection)


def test_503_retried_for_a_read_until_the_replica_has_the_collection(admin: Client, follower: Server) -> None:
    # The follower loads a new collection within 3 s; a search there before that is a 503. The race is run
    # until one search met the 503 (almost always the first), and every one must succeed in the end.
    met_503 = False
    for _ in range(5):
        name = "t-" + uuid.uuid4().hex[:12]
        admin.create_collection(name)
        events: list[RetryEvent] = []
        with Client(follower.url, retry=FAST_RETRY, on_retry=events.append) as replica:
            found = replica.search_images(name, text="a dog")
        admin.delete_collection(name)
        assert found["results"] == []
        if any(e.status == 503 and e.code == "unavailable" for e in events):
            met_503 = True
            break
    assert met_503


def test_503_on_a_write_is_retried_and_stores_nothing(admin: Client, unfollowing: Server) -> None:
    # The unfollowing server never loads a collection made after it started: its adds answer 503 before
    # anything is stored, so the client sends them again with the same key until its budget is spent, and the
    # collection is still empty.
    name = "t-" + uuid.uuid4().hex[:12]
    admin.create_collection(name)
    try:
        events: list[RetryEvent] = []
        short = RetryPolicy(max_attempts=3, max_seconds=5, backoff=0.05)
        with Client(unfollowing.url, retry=short, on_retry=events.append) as replica:
            with pytest.raises(Unavailable) as e:
                replica.add_image(name, PHOTOS[0])
            assert (e.value.status, e.value.code) == (503, "unavailable")
            assert [ev.attempt for ev in events] == [1, 2]
            # A read there is retried the same way.
            events.clear()
            with pytest.raises(Unavailable):
                replica.search_images(name, text="a dog")
        assert [ev.attempt for ev in events] == [1, 2]
        assert admin.list_images(name)["total"] == 0, "a refused write stored nothing"
    finally:
        admin.delete_collection(name)


def test_a_lost_answer_is_retried_with_the_same_idempotency_key(server: Server, admin: Client, collection: str) -> None:
    proxy = DroppingProxy(server.url, drop=1)
    events: list[RetryEvent] = []
    try:
        with Client(proxy.url, api_key=KEYS["admin"], retry=FAST_RETRY, on_retry=events.append) as c:
            added = c.add_image(collection, PHOTOS[0], external_id="lost-once", captions=["a dog"])
    finally:
        proxy.close()
    assert proxy.dropped == 1 and [e.code for e in events] == ["connection_failed"]
    # The first attempt was stored; the retry got its answer replayed instead of storing the photo again.
    assert admin.get_collection(collection)["images"] == 1
    assert admin.get_image_by_external_id(collection, "lost-once")["id"] == added["id"]


def test_a_lost_answer_to_an_unkeyed_write_is_not_retried(server: Server, admin: Client, collection: str) -> None:
    proxy = DroppingProxy(server.url, drop=1)
    events: list[RetryEvent] = []
    try:
        with Client(
            proxy.url, api_key=KEYS["admin"], retry=FAST_RETRY, on_retry=events.append, idempotency_keys=False
        ) as c:
            with pytest.raises(ConnectionFailed):
                c.add_image(collection, PHOTOS[0])
            # A read is safe to send again.
            proxy.drop, proxy.dropped = 1, 0
            assert c.get_collection(collection)["images"] == 1
    finally:
        proxy.close()
    assert [e.attempt for e in events] == [1]
    assert admin.get_collection(collection)["images"] == 1


def test_no_server_raises_connection_failed_within_the_budget() -> None:
    from conftest import free_port

    events: list[RetryEvent] = []
    policy = RetryPolicy(max_attempts=3, max_seconds=10, backoff=0.05)
    with Client(f"http://127.0.0.1:{free_port()}", retry=policy, on_retry=events.append) as c:
        with pytest.raises(ConnectionFailed) as e:
            c.create_collection("never")  # never sent, so retried although it writes
    assert e.value.status is None and e.value.attempts == 3 and len(events) == 2
