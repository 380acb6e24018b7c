"""Django app of the Django-based peers: django-tasks tasks and the hand-written ORM loop.

It has no migrations on purpose: ``migrate --run-syncdb`` creates its tables.
"""
