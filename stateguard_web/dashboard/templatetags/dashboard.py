"""``{% load dashboard %}``: statuses as colour and words, times, durations, JSON and money.

Everything here escapes what it is given (agent input, node names, errors): it returns markup
built with ``format_html`` or plain text that the template escapes.

Text from outside (input, usernames, errors, reasons) may hold characters that draw nothing
or rearrange the text around them: bidi controls (U+202E RIGHT-TO-LEFT OVERRIDE shows
``exe.gpj`` for ``jpg.exe``, and can make a row of the runs list read as something else),
zero-width spaces, control codes. Escaping for HTML lets them through, so they are never
rendered raw: ``visible`` shows each as a marker naming its code point, and puts text that is
not plain ASCII inside ``<bdi>``, so that right-to-left letters cannot reorder the page around
it either; JSON (``compact``,
``pretty``) shows them as the ``\\uXXXX`` escapes JSON has for them.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import UTC, datetime, timedelta
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from agents.mailbox import digest_of
from stateguard_web.dashboard import errors, labels, pages
from stateguard_web.dashboard.hidden import hidden

register = template.Library()


@register.simple_tag
def badge(kind: str, status: str) -> SafeString:
    """A status as a badge: colour, symbol and words (``labels``), its meaning as a tooltip."""
    shown = labels.label(kind, status)
    title = format_html(' title="{}"', shown.meaning) if shown.meaning else ""
    return format_html('<span class="badge st-{}" data-status="{}"{}><span aria-hidden="true">'
                       "{}</span> {}</span>", shown.css, status, title, shown.symbol,
                       shown.words)


@register.simple_tag
def badge_css(kind: str, status: str) -> str:
    return labels.label(kind, status).css


@register.simple_tag
def graph_legend() -> tuple[labels.Label, ...]:
    return labels.LEGEND


@register.simple_tag
def when(value: datetime | None, hint: bool = True) -> SafeString | str:
    """A time as ``<time>``: UTC in the markup; the page's script shows it in the reader's
    locale and time zone, with a relative hint ("3 min ago") unless ``hint`` is false."""
    if value is None:
        return "—"
    utc = value.astimezone(UTC)
    markup = ('<time datetime="{}" data-when>{}</time>' if hint
              else '<time datetime="{}" data-when="plain">{}</time>')
    return format_html(markup, utc.isoformat(), utc.strftime("%Y-%m-%d %H:%M:%S UTC"))


@register.simple_tag
def when_span(start: datetime, end: datetime) -> SafeString | str:
    """From ``start`` to ``end`` ("08:26:54 to 08:26:56 · 2 min ago", with an en dash); one
    time if they are the same second."""
    if start.replace(microsecond=0) == end.replace(microsecond=0):
        return when(start)
    return format_html("{} &ndash; {}", when(start, hint=False), when(end))


@register.simple_tag
def took(start: datetime | None, end: datetime | None) -> str:
    """How long from ``start`` to ``end`` ("340 ms", "2.4 s", "3 min 5 s"); "" if unfinished."""
    if start is None or end is None:
        return ""
    return labels.seconds_words((end - start).total_seconds())


@register.filter
def visible(value: Any) -> SafeString:
    """Text from outside, isolated (``<bdi>``), each hidden character as a marker
    (``<span class="ctrl">U+202E</span>``, its name in the title). ASCII with nothing hidden
    but line breaks, most of what comes by, is only escaped: it has no right-to-left letter."""
    text = "" if value is None else str(value)
    if text.isascii() and (text.isprintable() or not any(map(hidden, text))):
        return escape(text)  # a traceback: ASCII lines
    parts, start = [], 0
    if not text.isprintable():  # else nothing is hidden (checked at C speed)
        for at, char in enumerate(text):
            if hidden(char):
                parts += [escape(text[start:at]), format_html(
                    '<span class="ctrl" title="{}">{}</span>',
                    unicodedata.name(char, "control character"), f"U+{ord(char):04X}")]
                start = at + 1
    parts.append(escape(text[start:]))
    return mark_safe(f"<bdi>{''.join(parts)}</bdi>")  # every part is escaped


def _json_text(text: str) -> str:
    """JSON text with every hidden character as its ``\\u`` escape (JSON escapes only the
    C0 controls by itself; outside strings it writes nothing hidden but line breaks)."""
    if text.isprintable():
        return text
    return "".join("".join(f"\\u{unit:04x}" for unit in _utf16(char)) if hidden(char)
                   else char for char in text)


def _utf16(char: str) -> tuple[int, ...]:
    data = char.encode("utf-16-be")
    return tuple(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))


@register.filter
def lasted(span: timedelta) -> str:
    """A run's duration in the runs list: "2.4 s", "3 min 5 s"."""
    return labels.seconds_words(span.total_seconds())


@register.filter
def duration(seconds: float | None) -> str:
    """Whole seconds in words ("45 s", "3 min 5 s", "2 h 4 min"), as the page's script
    keeps a waiting time current (dashboard.js, ``duration``)."""
    whole = max(int(seconds or 0), 0)
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


@register.simple_tag
def waited(since: datetime) -> SafeString:
    """How long something has waited since ``since``: the page's script keeps it current."""
    utc = since.astimezone(UTC)
    return format_html('<span class="waited" data-waited-since="{}">waiting {}</span>',
                       utc.isoformat(), duration((timezone.now() - since).total_seconds()))


@register.filter
def pretty(value: Any) -> str:
    """JSON, indented, for a ``<pre>`` (the template escapes it)."""
    return _json_text(json.dumps(value, indent=2, ensure_ascii=False, default=str,
                                 sort_keys=True))


@register.filter
def compact(value: Any, limit: int = 90) -> str:
    """JSON on one line, cut at ``limit`` characters."""
    text = _json_text(json.dumps(value, ensure_ascii=False, default=str,
                                 separators=(", ", ": ")))
    return text if len(text) <= limit else text[:limit - 1] + "…"


ZERO_DECIMAL = {"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx",
                "vnd", "vuv", "xaf", "xof", "xpf"}


@register.simple_tag
def money(amount: Any, currency: Any = "") -> str:
    """An amount in the currency's smallest unit, as people read it: 25000 usd -> 250.00 USD."""
    if not isinstance(amount, int) or isinstance(amount, bool):
        return "" if amount is None else str(amount)
    code = str(currency or "").lower()
    text = f"{amount:,}" if code in ZERO_DECIMAL else f"{amount / 100:,.2f}"
    return f"{text} {code.upper()}".strip()


@register.filter
def short(code: Any) -> str:
    """The first eight characters of a run id, as lists show it (search takes them too)."""
    return str(code)[:8]


@register.filter
def gate_state(payload: Any) -> dict[str, Any]:
    """What an approval decides on: the state a node's gate saw (the core puts it under
    ``state``), or the arguments of a tool call waiting for its approval (``args``, beside
    ``tool``: stateguard.tools), so that an amount and an e-mail in either are shown alike."""
    if isinstance(payload, dict):
        for key in ("state", "args"):
            if isinstance(payload.get(key), dict):
                return payload[key]  # type: ignore[no-any-return]
        return payload
    return {}


@register.filter
def gate_tool(payload: Any) -> str:
    """The tool an approval is for, if it gates a tool call (else "")."""
    if isinstance(payload, dict) and isinstance(payload.get("args"), dict):
        return str(payload.get("tool") or "")
    return ""


@register.filter
def error_summary(error: Any) -> str:
    """An error the journal keeps (``{"type", "message", "traceback"}``) in plain words, in
    one line ("Stripe unreachable (connection refused)")."""
    return errors.summary(error)


@register.inclusion_tag("dashboard/_raw_error.html")
def raw_error(error: Any, same: int = 1) -> dict[str, Any]:
    """The raw error (its whole message, its traceback) behind a click, below its summary:
    an SDK's message can be long and say little to an operator."""
    text = errors.raw(error)
    traceback = error.get("traceback") if isinstance(error, dict) else ""
    return {"text": text, "differs": text != errors.summary(error), "traceback": traceback,
            "same": same}


@register.filter
def attempt_groups(attempts: Any) -> list[errors.AttemptGroup]:
    """A compensation's attempts, those that ended the same way one after another as one."""
    return errors.group_attempts(attempts)


@register.filter
def capped(count: int) -> str:
    """A count from ``pages.capped_count`` as shown: "1000+" past the cap."""
    return f"{pages.COUNT_CAP}+" if count > pages.COUNT_CAP else str(count)


@register.filter
def mail_digest(message_id: Any) -> str:
    """What names an e-mail in the Outbox's URL: its ``Message-ID``'s digest."""
    return digest_of(str(message_id))
