from django_delayq import handler


@handler("noop")
def noop(message):
    """Does nothing: measures the queue's own cost."""
