"""Indexes that make the admin's search fast on a big table (PostgreSQL, opt-in).

Add ``"django_delayq.contrib.search_indexes"`` to ``INSTALLED_APPS`` and run
``migrate``: its migration builds, with ``CREATE INDEX CONCURRENTLY`` (the
table stays writable meanwhile), one index per kind of search term:

* ``delayq_search_key_idx``: the message key, for a word's key match (exact or
  prefix: ``key LIKE 'word%'``);
* ``delayq_search_group_idx``: the group of grouped messages, likewise;
* ``delayq_search_payload_idx``: a GIN ``jsonb_path_ops`` index on the payload,
  for ``path=value`` terms (``payload @> '{"companyId": 3345}'``);
* ``delayq_search_error_idx``: a trigram GIN index on the last error of the
  messages that have one, for a word found anywhere in it (needs the
  ``pg_trgm`` extension, which the migration creates if it may).

They are not part of ``django_delayq``'s own migrations because each one is
written on every enqueue (the key and payload indexes) or every failure (the
error index): the benchmarks' figures say what that costs, so a project that
rarely searches a big table need not pay it. On SQLite and MariaDB/MySQL the
migration does nothing. Reversing it (``migrate delayq_search_indexes zero``)
drops the indexes and keeps the extension.
"""
