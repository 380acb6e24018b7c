"""Check what ``make dist`` built, then install the wheel where nothing else is.

    python scripts/check_dist.py [DIST_DIR]      (default: dist)

1. The wheel and the sdist hold every file of ``django_delayq/`` that git
   tracks: the modules and the run-time data (the admin's templates and
   static file, ``py.typed``, the store's SQL, the Spark job's
   ``log4j2.properties``); the wheel holds nothing else but its metadata.
2. The metadata: a Markdown description, the MIT licence with its file, no
   project URL (there is no public repository or hosted documentation).
3. A fresh virtualenv, outside the clone, installs the wheel and its
   dependencies; there a minimal project uses what the package ships:
   ``manage.py check`` and ``migrate``, an admin template, the static file,
   and a message enqueued and run by ``run_delayq --burst`` on SQLite.

Exits non-zero, saying why, at the first step that fails.
"""

from __future__ import annotations

import email.parser
import os
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_delayq"
# What a wheel built from the wrong package-data would silently lack.
RUNTIME_DATA = (
    "django_delayq/py.typed",
    "django_delayq/templates/admin/django_delayq/*.html",
    "django_delayq/templates/admin/django_delayq/message/*.html",
    "django_delayq/templates/admin/django_delayq/includes/*.html",
    "django_delayq/static/django_delayq/*.css",
    "django_delayq/store/sql/*.sql",
    "django_delayq/contrib/spark/*.properties",
    "django_delayq/migrations/0001_*.py",
)

SMOKE = r"""
import sys
from importlib import resources
from pathlib import Path

import django
from django.conf import settings

here = Path(sys.argv[1])
settings.configure(
    SECRET_KEY="dist-check",
    USE_TZ=True,
    INSTALLED_APPS=[
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django.contrib.staticfiles",
        "django_delayq",
    ],
    DATABASES={
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(here / "db.sqlite3")}
    },
    TEMPLATES=[
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ],
    MIDDLEWARE=[
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ],
    STATIC_URL="/static/",
    DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
)
django.setup()

import django_delayq
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.template.loader import get_template

from django_delayq import enqueue, handler
from django_delayq.models import Message

assert Path(django_delayq.__file__).is_relative_to(Path(sys.prefix)), django_delayq.__file__
package = resources.files("django_delayq")
assert package.joinpath("py.typed").is_file()
assert package.joinpath("contrib/spark/log4j2.properties").is_file()
get_template("admin/django_delayq/dashboard.html")
get_template("admin/django_delayq/message/change_list.html")
assert finders.find("django_delayq/admin.css")
call_command("check")
call_command("migrate", verbosity=0)

ran = []


@handler("dist-check")
def run(message):
    ran.append(message.pk)


message = enqueue("dist-check", {"hello": "wheel"}).message
call_command("run_delayq", "--burst", "--queue", "dist-check", verbosity=0)
assert ran == [message.pk], ran
assert Message.objects.get(pk=message.pk).status == "succeeded"
print(f"django-delayq {django_delayq.__version__} from {Path(django_delayq.__file__).parent}")
"""


def fail(reason: str) -> None:
    print(f"check_dist: FAILED: {reason}", file=sys.stderr)
    sys.exit(1)


def tracked_files() -> list[str]:
    """The package's files as git tracks them (a plain walk outside a clone)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", PACKAGE],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
    if not files:
        files = [
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / PACKAGE).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
    return sorted(files)


def check_contents(kind: str, names: set[str], expected: list[str]) -> None:
    missing = [f for f in expected if f not in names]
    if missing:
        fail(f"the {kind} lacks {len(missing)} file(s): {', '.join(missing)}")
    for pattern in RUNTIME_DATA:
        if not any(fnmatch(name, pattern) for name in names):
            fail(f"the {kind} has no file matching {pattern}")


def check_metadata(text: str) -> None:
    meta = email.parser.Parser().parsestr(text)
    problems = []
    if meta.get("Description-Content-Type") != "text/markdown":
        problems.append(f"Description-Content-Type is {meta.get('Description-Content-Type')!r}")
    if meta.get("License-Expression") != "MIT":
        problems.append(f"License-Expression is {meta.get('License-Expression')!r}")
    if "LICENSE" not in (meta.get_all("License-File") or []):
        problems.append("no License-File: LICENSE")
    for field in ("Project-URL", "Home-page", "Download-URL"):
        if meta.get_all(field):
            problems.append(f"{field}: {meta.get_all(field)} (no URL of the project exists)")
    if problems:
        fail("wheel metadata: " + "; ".join(problems))


def smoke_test(wheel: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
    with tempfile.TemporaryDirectory(prefix="delayq-dist-") as tmp:
        venv = Path(tmp) / "venv"
        python = venv / "bin" / "python"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
        print(f"installing {wheel.name} into a fresh virtualenv ({venv})")
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
            check=True,
            env=env,
            cwd=tmp,
        )
        done = subprocess.run(
            [str(python), "-c", SMOKE, tmp], env=env, cwd=tmp, capture_output=True, text=True
        )
        if done.returncode:
            fail(f"the installed wheel does not work:\n{done.stdout}{done.stderr}")
        print(done.stdout.strip())


def main() -> None:
    dist = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "dist").resolve()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    wheel = dist / f"{PACKAGE}-{version}-py3-none-any.whl"
    sdist = dist / f"{PACKAGE}-{version}.tar.gz"
    for path in (wheel, sdist):
        if not path.is_file():
            fail(f"{path} is missing: run make dist")
    expected = tracked_files()

    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = f"{PACKAGE}-{version}.dist-info/"
        check_contents("wheel", names, expected)
        strays = sorted(n for n in names if not n.startswith((f"{PACKAGE}/", dist_info)))
        if strays:
            fail(f"the wheel holds files outside {PACKAGE}/: {', '.join(strays)}")
        if f"{dist_info}licenses/LICENSE" not in names:
            fail("the wheel lacks its LICENSE")
        check_metadata(zf.read(f"{dist_info}METADATA").decode())
    print(f"{wheel.name}: {len(expected)} files of {PACKAGE}/, metadata and LICENSE")

    prefix = f"{PACKAGE}-{version}/"
    with tarfile.open(sdist) as tf:
        names = {m.name.removeprefix(prefix) for m in tf.getmembers() if m.isfile()}
    check_contents("sdist", names, expected)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if name not in names:
            fail(f"the sdist lacks {name}")
    print(f"{sdist.name}: {len(expected)} files of {PACKAGE}/, pyproject.toml, README.md, LICENSE")

    smoke_test(wheel)
    print("check_dist: OK")


if __name__ == "__main__":
    main()
