"""Orders: the example app that produces and consumes django-delayq messages."""
