"""Error fingerprints: one group per bug, not one per message.

``Message.last_error`` is stored as ``"module.Type: message"`` (see
``execute.describe``). Two failures of the same bug differ only in the
values their message quotes (ids, numbers, names, addresses), so the
fingerprint keeps the exception type as it is and replaces those values with
placeholders in the first line of the message; the hash of that normal form
is stored on the row (``Message.error_fingerprint``, set by ``claim.fail``),
so the triage page groups failures with one indexed ``GROUP BY``.
"""

from __future__ import annotations

import hashlib
import re

# Long enough for any digest we might switch to; the current one is 32 chars.
FINGERPRINT_MAX_LENGTH = 64

# Only the first line is normalised: later lines of an exception message
# (a database's DETAIL, a validation report) vary more than they identify.
_MAX_TEXT = 1000

_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b"
)
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_HEX = re.compile(
    r"\b0[xX][0-9a-fA-F]+\b"
    # A hash or an object id: 8+ hex digits mixing digits and letters.
    r"|\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# A quote opens only where a word does not continue ("can't" is no quote).
_QUOTED = re.compile(r"""(?<!\w)'[^'\n]*'(?!\w)|(?<!\w)"[^"\n]*"(?!\w)""")
_SPACES = re.compile(r"\s+")


def split_error(error_text: str) -> tuple[str, str]:
    """``("module.Type", "message")`` from a stored ``last_error``."""
    first_line = error_text.strip().split("\n", 1)[0].strip()
    kind, sep, message = first_line.partition(": ")
    if not sep:
        return first_line, ""
    return kind, message


def normalise_message(message: str) -> str:
    """Replace the values in an exception message with placeholders.

    A message that is one quoted value and nothing else (``KeyError:
    'user_id'``) keeps it: there the value is what tells one bug from
    another; numbers and ids inside it are still replaced.
    """
    text = message[:_MAX_TEXT]
    text = _UUID.sub("<uuid>", text)
    text = _EMAIL.sub("<email>", text)
    text = _HEX.sub("<hex>", text)
    text = _NUMBER.sub("<n>", text)
    stripped = text.strip()
    if _QUOTED.fullmatch(stripped) is None:
        text = _QUOTED.sub(lambda m: m.group(0)[0] + "…" + m.group(0)[0], text)
    return _SPACES.sub(" ", text).strip()


def normalise(error_text: str) -> str:
    """The readable normal form: ``"module.Type: message with <n> and '…'"``."""
    kind, message = split_error(error_text)
    message = normalise_message(message)
    return f"{kind}: {message}" if message else kind


def fingerprint(error_text: str) -> str:
    """A short stable digest of ``normalise(error_text)``; ``""`` for no error."""
    if not error_text or not error_text.strip():
        return ""
    return hashlib.blake2b(normalise(error_text).encode(), digest_size=16).hexdigest()
