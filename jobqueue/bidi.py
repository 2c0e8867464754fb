"""Bidirectional controls: characters that make a terminal or browser that honours them show the
text after them in another order, so that an error can read as something else (U+202E, the
right-to-left override, shows "\\u202egnp.exe" as "exe.png")."""

from __future__ import annotations

CONTROLS = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
# Each written as the escape Python and JSON read back as that character: \u202e.
ESCAPES = {code: f"\\u{code:04x}" for code in CONTROLS}


def bidi_escaped(text: str) -> str:
    """``text`` with each bidirectional control written as its escape (\\u202e), the rest as it is."""
    return text.translate(ESCAPES)
