"""Characters from outside that draw nothing or move the text around them: bidi controls
(U+202E RIGHT-TO-LEFT OVERRIDE makes ``exe.jpg`` read ``gpj.exe``), zero-width characters,
control codes. Pages show each as a marker naming its code point, never as itself: in markup
the ``visible`` filter (templatetags/dashboard.py), in text alone (a ``<title>``, an
``aria-label``, an SVG picture's words) ``marked``."""

from __future__ import annotations

import unicodedata

_KEPT = frozenset("\t\n\r\u200c\u200d")  # line breaks; the joiners some scripts and emoji need


def hidden(char: str) -> bool:
    """Whether ``char`` draws nothing or moves the text around it: a control code (but tab
    and line breaks), a format character (bidi controls, zero-width space, BOM; but the
    zero-width joiners) or a line or paragraph separator."""
    return char not in _KEPT and unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp")


def marked(text: str) -> str:
    """``text`` with each hidden character as its code point, in brackets: "[U+202E]"."""
    if text.isprintable():  # checked at C speed: most text has none
        return text
    return "".join(f"[U+{ord(c):04X}]" if hidden(c) else c for c in text)
