import uuid

import factory
from django.utils import timezone

from django_delayq.models import Message


class MessageFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Message

    queue = "default"
    key = factory.LazyFunction(lambda: uuid.uuid4().hex)
    payload = factory.Dict({})
    status = Message.Status.PENDING
    next_attempt_time = factory.LazyFunction(timezone.now)
    scheduled_time = factory.LazyFunction(timezone.now)
