"""aenqueue / aenqueue_many from async code: async tests and an async view."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.test import TestCase, TransactionTestCase, override_settings
from django.urls import path
from django.utils import timezone

from django_delayq import Outcome, aenqueue, aenqueue_many, signals
from django_delayq.models import Message


async def subscribe(request: HttpRequest) -> JsonResponse:
    """An async view that enqueues a welcome email."""
    email = json.loads(request.body)["email"]
    result = await aenqueue("default", {"to": email}, key=f"welcome-{email}", delay=60)
    return JsonResponse({"message": result.message.pk, "outcome": result.outcome}, status=202)


urlpatterns = [path("subscribe/", subscribe)]


class AEnqueueTests(TestCase):
    async def test_aenqueue_writes_a_message(self) -> None:
        result = await aenqueue("default", {"n": 1}, key="async-1", priority=5, delay=30)
        self.assertIs(result.outcome, Outcome.CREATED)
        stored = await Message.objects.aget(pk=result.message.pk)
        self.assertEqual(
            (stored.queue, stored.key, stored.payload), ("default", "async-1", {"n": 1})
        )
        self.assertEqual(stored.priority, 5)
        self.assertEqual(stored.next_attempt_time - stored.created_at, timedelta(seconds=30))
        again = await aenqueue("default", {"n": 2}, key="async-1")
        self.assertIs(again.outcome, Outcome.IGNORED)

    async def test_aenqueue_many(self) -> None:
        results = await aenqueue_many("default", ({"n": i} for i in range(3)), keys=["a", "b", "c"])
        self.assertEqual([r.outcome for r in results], [Outcome.CREATED] * 3)
        self.assertEqual(await Message.objects.filter(queue="default").acount(), 3)

    async def test_bad_arguments_raise_before_writing(self) -> None:
        with self.assertRaisesMessage(ValueError, "pass either run_at or delay"):
            await aenqueue("default", {}, delay=1, run_at=timezone.now())
        with self.assertRaises(ValueError):
            await aenqueue("not a queue!", {})
        self.assertEqual(await Message.objects.acount(), 0)

    @override_settings(ROOT_URLCONF=__name__)
    async def test_async_view(self) -> None:
        response = await self.async_client.post(
            "/subscribe/", {"email": "a@example.com"}, content_type="application/json"
        )
        self.assertEqual(response.status_code, 202)
        stored = await Message.objects.aget(pk=response.json()["message"])
        self.assertEqual(stored.key, "welcome-a@example.com")
        self.assertEqual(stored.payload, {"to": "a@example.com"})


class AEnqueueCommitsAtOnceTests(TransactionTestCase):
    async def test_the_message_is_committed_when_aenqueue_returns(self) -> None:
        announced: list[int] = []

        def receiver(sender: Any, message: Message, **kwargs: Any) -> None:
            announced.append(message.pk)

        signals.message_enqueued.connect(receiver, weak=False)
        try:
            result = await aenqueue("default", {}, key="committed")
        finally:
            signals.message_enqueued.disconnect(receiver)
        # message_enqueued is sent on commit: aenqueue's own transaction is done.
        self.assertEqual(announced, [result.message.pk])
