"""Who may read a stream: the reader entries a START names, and the tags of a verified client.

A START may name the readers of its stream (``"readers": ["user:alice", "groups:ops"]``). Each
entry is ``<kind>:<value>``:

* ``user:<sub>``: the user whose verified token has this ``sub``;
* ``<claim>:<value>``: any user whose token carries ``value`` in the claim ``claim`` (a string,
  or a list of strings), provided the authorizer passes that claim on (``JWT_READER_CLAIMS``).

A connection's *tags* are ``user:<its sub>`` plus ``<claim>:<value>`` for every passed-on claim
value; it may read a stream when one of its tags is among the stream's readers. No readers (the
attribute absent, or an empty list) means nobody: the default is deny.

Everything here is validated the same way at both edges, the event router (a START's readers)
and the authorizer (a token's claims), so an entry that could never match is refused when it is
written, and a claim value that is not a valid tag is never passed on.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from . import model

KIND_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
KIND_DOC = "1 to 64 letters, digits and _ . -"
# Claim names may hold a colon (Cognito's ``cognito:groups``): a tag is compared whole, never
# parsed, so ``cognito:groups:ops`` is unambiguous.
CLAIM_PATTERN = re.compile(r"[A-Za-z0-9_.:\-]{1,64}")
CLAIM_DOC = "1 to 64 letters, digits and _ . : -"
MAX_TAGS = 64  # per connection
# API Gateway refuses an authorizer answer over 8 KB: the tags get at most half of it.
MAX_TAGS_BYTES = 4096
USER_KIND = model.READER_USER_PREFIX.removesuffix(":")


def _check_text(field: str, value: str) -> None:
    if not value:
        raise ValueError(f"{field}: must not be empty")
    if len(value) > model.MAX_READER_CHARS:
        raise ValueError(f"{field}: longer than {model.MAX_READER_CHARS} characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{field}: not valid Unicode") from None
    if any(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf") for ch in value):
        raise ValueError(f"{field}: must not contain whitespace or control characters")


def check_claim_name(field: str, value: object) -> str:
    """A claim name the authorizer may pass on: :data:`CLAIM_PATTERN`, never ``user`` (nor
    starting with ``user:``: its tags would read as a user's)."""
    if not isinstance(value, str) or not CLAIM_PATTERN.fullmatch(value):
        raise ValueError(f"{field}: a claim name is {CLAIM_DOC}, got {value!r}")
    if value == USER_KIND or value.startswith(model.READER_USER_PREFIX):
        raise ValueError(f"{field}: {USER_KIND!r} is reserved for the token's sub")
    return value


def check_reader(field: str, value: object) -> str:
    """One reader entry ``<kind>:<value>``; ``ValueError`` naming ``field`` otherwise."""
    if not isinstance(value, str):
        raise ValueError(f"{field}: expected a string, got {type(value).__name__}")
    _check_text(field, value)
    kind, separator, rest = value.partition(":")
    if not separator or not KIND_PATTERN.fullmatch(kind):
        raise ValueError(
            f"{field}: expected user:<sub> or <claim>:<value> (the kind is {KIND_DOC}), "
            f"got {value[:40]!r}"
        )
    if not rest:
        raise ValueError(f"{field}: {kind}: needs a value after the colon")
    return value


def check_readers(field: str, value: object) -> tuple[str, ...]:
    """A START's readers: a list of at most :data:`~streamfleet.model.MAX_READERS` entries,
    duplicates dropped, order kept. An empty list is allowed: nobody may read."""
    if not isinstance(value, list):
        raise ValueError(f"{field}: expected a list of reader entries, got {type(value).__name__}")
    if len(value) > model.MAX_READERS:
        raise ValueError(f"{field}: at most {model.MAX_READERS} entries, got {len(value)}")
    checked: dict[str, None] = {}
    for index, entry in enumerate(value):
        checked[check_reader(f"{field}[{index}]", entry)] = None
    return tuple(checked)


def user_tag(sub: str) -> str:
    """The tag of a verified ``sub``: ``user:<sub>``."""
    return f"{model.READER_USER_PREFIX}{sub}"


def claim_tags(claims: Mapping[str, Any], claim_names: Iterable[str]) -> list[str]:
    """``<claim>:<value>`` for every value of the named claims that is a valid tag (a string,
    or a string in a list); anything else is left out, never passed on. At most
    :data:`MAX_TAGS`, encoded in at most :data:`MAX_TAGS_BYTES`."""
    tags: dict[str, None] = {}
    size = 2  # the brackets of the encoded list
    for name in claim_names:
        raw = claims.get(name)
        values = raw if isinstance(raw, list) else [raw]
        for value in values:
            if not isinstance(value, str):
                continue
            tag = f"{name}:{value}"
            try:
                check_reader("tag", tag)
            except ValueError:
                continue
            if tag in tags:
                continue
            size += len(json.dumps(tag)) + 1
            if size > MAX_TAGS_BYTES:
                return list(tags)
            tags[tag] = None
            if len(tags) >= MAX_TAGS:
                return list(tags)
    return list(tags)


def encode_tags(tags: Iterable[str]) -> str:
    """Tags as the authorizer context carries them (a JSON array in a string)."""
    return json.dumps(list(tags), separators=(",", ":"))


def decode_tags(text: object) -> list[str]:
    """The tags of an authorizer context value; anything malformed counts as no tag (deny)."""
    if not isinstance(text, str) or not text:
        return []
    try:
        value = json.loads(text)
    except ValueError:
        return []
    if not isinstance(value, list):
        return []
    tags = []
    for entry in value[:MAX_TAGS]:
        if isinstance(entry, str) and not entry.startswith(model.READER_USER_PREFIX):
            # A user tag comes only from the verified sub, never from the context's list.
            tags.append(entry)
    return tags


def claim_tags_only(tags: Iterable[str]) -> list[str]:
    """``tags`` without the user tag (which comes from the verified ``sub`` alone)."""
    return [tag for tag in tags if not tag.startswith(model.READER_USER_PREFIX)]


def may_read(readers: Iterable[str] | None, tags: Iterable[str]) -> bool:
    """Whether a connection with ``tags`` may read a stream with ``readers`` (default deny)."""
    if not readers:
        return False
    return not set(readers).isdisjoint(tags)
