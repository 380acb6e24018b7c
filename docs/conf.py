"""Sphinx configuration of the django-delayq documentation (``make docs``).

Pages are Markdown (MyST-Parser); the theme is Furo. The build is offline:
no intersphinx, so the names of Python, Django and other libraries in
signatures cannot be resolved and are listed in ``nitpick_ignore_regex``
(third-party names only: every name of django-delayq must resolve).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

# autodoc imports the models: Django is set up with a settings module of the
# docs' own (SQLite in memory, never opened).
os.environ["DJANGO_SETTINGS_MODULE"] = "delayq_docs_settings"
import django  # noqa: E402

django.setup()

import django_delayq  # noqa: E402

project = "django-delayq"
author = "django-delayq developers"
copyright = "django-delayq developers"
release = version = django_delayq.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "delayq_docs"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "screenshots"]
myst_enable_extensions = ["deflist", "colon_fence"]
myst_heading_anchors = 3
# Option names and quoted setting keys stay as typed (no en dashes, no curly quotes).
smartquotes = False

html_theme = "furo"
html_title = f"django-delayq {release}"
html_static_path: list[str] = []
html_show_sourcelink = False

nitpicky = True
# Third-party names that appear in signatures and bases: Python's standard
# library, Django, the Tasks backport, typing helpers. Never the project's own.
nitpick_ignore_regex = [
    (r"py:.*", r"(datetime|decimal|uuid|collections\.abc|typing|types|enum|argparse)\..*"),
    (r"py:.*", r"(datetime|timedelta|Iterable|Sequence|Mapping|Callable|Iterator)"),
    (r"py:.*", r"(django|django_tasks|asgiref)\..*"),
    (r"py:.*", r"(QuerySet|Model|Expression|Signal|StrOrPromise|HttpRequest|HttpResponse)"),
    (r"py:.*", r"(tasks\.)?(Task|TaskResult|BaseTaskBackend)"),
]

autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": True}
add_module_names = False
python_use_unqualified_type_names = True
