"""Bidirectional controls: characters that make a terminal or browser that honours them show the
text after them in another order, so that an error can read as something else (U+202E, the
right-to-left override, shows "\\u202egnp.exe" as "exe.png")."""

from __future__ import annotations

import re

CONTROLS = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
# Lone surrogates: a value can hold them (a file name read with surrogateescape, kept by pickle),
# but no UTF-8 page, terminal or JSON output can: writing one raised UnicodeEncodeError.
SURROGATES = range(0xD800, 0xE000)
SURROGATE_ESCAPES = {code: f"\\u{code:04x}" for code in SURROGATES}
# Each written as the escape Python and JSON read back as that character: \u202e.
ESCAPES = {**{code: f"\\u{code:04x}" for code in CONTROLS}, **SURROGATE_ESCAPES}


def bidi_escaped(text: str) -> str:
    """``text`` with each bidirectional control written as its escape (\\u202e), the rest as it is."""
    return text.translate(ESCAPES)


# What else a log line must not carry raw: line breaks (a job's text would start a line of its own,
# forged as the log's), carriage returns, terminal escape sequences and the other C0 and C1
# controls, and Unicode's own line and paragraph separators. Tabs stay as they are.
_LINE_CONTROLS = (*range(0x00, 0x09), *range(0x0A, 0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)
LINE_ESCAPES = {
    **ESCAPES,
    **{code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _LINE_CONTROLS},
    0x0A: "\\n",
    0x0D: "\\r",
}
# Any one of them: found by a search that stops at the first, where a translation reads it all.
_ANY_LINE_ESCAPE = re.compile("[" + "".join(re.escape(chr(code)) for code in LINE_ESCAPES) + "]")
# Where a traceback's own line breaks must stay: all of the above but the newline.
BLOCK_ESCAPES = {code: escape for code, escape in LINE_ESCAPES.items() if code != 0x0A}


def line_escaped(text: str) -> str:
    """``text`` as one line: bidirectional controls, line breaks and other control characters
    written as escapes (\\u202e, \\n, \\x1b), the rest as it is."""
    return text if text.isprintable() else text.translate(LINE_ESCAPES)


def needs_escape(text: str) -> bool:
    """Whether :func:`line_escaped` changes ``text``: ``str.isprintable`` first, which is quick and
    refuses more (a no-break space, the joiner inside an emoji, which stay as they are)."""
    return not text.isprintable() and _ANY_LINE_ESCAPE.search(text) is not None


def block_escaped(text: str) -> str:
    """:func:`line_escaped`, keeping the line breaks (of a traceback)."""
    return text.translate(BLOCK_ESCAPES)
