"""Text from outside never reaches a page with the characters that rearrange or hide it.

A submitter's input, a name, an error or a reason may hold bidi controls (U+202E
RIGHT-TO-LEFT OVERRIDE makes ``exe.jpg`` read ``gpj.exe`` and can make a row say something
else), zero-width characters or control codes. Each page shows them as a marker naming the
code point (JSON as its ``\\uXXXX`` escape) and isolates outside text that is not plain
ASCII in ``<bdi>``.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import timedelta

from django.utils import timezone

from stateguard_web.dashboard.templatetags.dashboard import compact, pretty, visible
from stateguard_web.sagas.models import Approval, AuditEvent, Batch, Compensation, Run, Step
from tests.web.dashboard.world import DashboardWorld, make_user

RLO, LRI, ZWSP, NEL = "\u202e", "\u2066", "\u200b", "\x85"
SPOOF = f"invoice{RLO}fdp.exe"  # reads "invoiceexe.pdf"


def hidden(html: str) -> list[str]:
    """The characters of ``html`` that draw nothing or move the text around them."""
    return sorted({f"U+{ord(c):04X}" for c in html if c not in "\t\n\r\u200c\u200d"
                   and unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")})


class HiddenCharacterTests(DashboardWorld):
    @classmethod
    def setUpTestData(cls) -> None:
        super().setUpTestData()
        now = timezone.now()
        cls.mallory = make_user(f"mallory{RLO}", "submitter")
        cls.spoofed = Run.objects.create(
            agent="checkout", status=Run.Status.NEEDS_ATTENTION, submitted_by=cls.mallory,
            input={"email": f"a{RLO}@b.co", "amount": 100, "note": SPOOF + ZWSP + NEL},
            error={"type": "BookingFailed", "message": f"no room for {SPOOF}",
                   "traceback": f"Traceback (most recent call last):\n  {LRI}boom"})
        charged = Step.objects.create(
            run=cls.spoofed, step_id="s-charge", node="charge_user",
            status=Step.Status.SUCCEEDED, started_at=now, finished_at=now, done_seq=1,
            update={"charge_id": f"ch_{RLO}1"})
        undo = Compensation.objects.create(run=cls.spoofed, step=charged, node="charge_user",
                                           idempotency_key="k-1",
                                           status=Compensation.Status.FAILED,
                                           triggered_by=f"ops{RLO}")
        undo.attempts.create(number=1, started_at=now, finished_at=now, ok=False,
                             error={"type": "APIError", "message": f"said {SPOOF}",
                                    "traceback": f"tb {RLO}"})
        undo.attempts.create(number=2, started_at=now, finished_at=now, ok=True,
                             result=f"refunded re_{RLO}1")
        cls.gated = Run.objects.create(agent="checkout", status=Run.Status.PAUSED,
                                       submitted_by=cls.mallory,
                                       input={"email": f"b{RLO}@c.co", "amount": 25000})
        Approval.objects.create(run=cls.gated, step_id="t-gate", node="charge_user",
                                requested_at=now, payload={"state": {
                                    "email": f"b{RLO}@c.co", "amount": 25000}})
        Approval.objects.create(run=cls.spoofed, step_id="t-old", node="charge_user",
                                requested_at=now - timedelta(minutes=1), decided_at=now,
                                status=Approval.Status.APPROVED, decided_by=f"olivia{RLO}",
                                reason=f"ok {SPOOF}")
        AuditEvent.objects.create(run=cls.spoofed, actor=f"mallory{RLO}",
                                  action="run.submitted", data={"note": SPOOF})
        cls.batch = Batch.objects.create(action=Batch.Action.RETRY, actor=f"olivia{RLO}",
                                         reason=f"outage {SPOOF}",
                                         selection={"runs": [str(cls.spoofed.code)]})
        cls.batch.items.create(position=0, run=cls.spoofed, run_code=cls.spoofed.code,
                               status_before=cls.spoofed.status, outcome="skipped",
                               reason=f"refused: {SPOOF}")

    def test_it_shows_no_page_with_a_raw_hidden_character(self) -> None:
        pages = ["/", self.url(self.spoofed), self.url(self.gated),
                 f"{self.url(self.gated)}?confirm=approve-{self.gated.approvals.get().pk}",
                 "/inbox/approvals/", "/inbox/attention/", f"/batches/{self.batch.code}/"]
        for path in pages:
            with self.subTest(path=path):
                response = self.client_for("charlie").get(path)
                assert response.status_code == 200
                html = response.content.decode()
                assert hidden(html) == []
                assert ">U+202E</span>" in html or "\\u202e" in html

    def test_it_marks_each_hidden_character_and_isolates_outside_text(self) -> None:
        html = self.client_for("charlie").get(self.url(self.spoofed)).content.decode()
        marker = '<span class="ctrl" title="RIGHT-TO-LEFT OVERRIDE">U+202E</span>'
        assert f"<bdi>mallory{marker}</bdi>" in html  # who submitted it
        assert f"<bdi>BookingFailed: no room for invoice{marker}fdp.exe</bdi>" in html
        assert '<span class="ctrl" title="LEFT-TO-RIGHT ISOLATE">U+2066</span>boom' in html
        assert f"<bdi>olivia{marker}</bdi>" in html and f"<bdi>ok invoice{marker}" in html
        assert f"<bdi>refunded re_{marker}1</bdi>" in html
        # JSON (the input, a step's update, the audit trail's data) shows JSON's escapes.
        assert "&quot;invoice\\u202efdp.exe\\u200b\\u0085&quot;" in html
        assert "&quot;ch_\\u202e1&quot;" in html
        listed = self.client_for("charlie").get("/").content.decode()
        assert "&quot;note&quot;: &quot;invoice\\u202efdp.exe" in listed
        assert f"<bdi>mallory{marker}</bdi>" in listed

    def test_it_keeps_the_text_itself_and_what_needs_no_marker(self) -> None:
        assert visible(None) == "" and visible("alice <x>") == "alice &lt;x&gt;"
        assert visible("<b>Zoë & 李</b>") == "<bdi>&lt;b&gt;Zoë &amp; 李&lt;/b&gt;</bdi>"
        family = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # joined by zero-width joiners
        assert visible(f"שלום {family}\n\tx") == f"<bdi>שלום {family}\n\tx</bdi>"
        assert visible("\U000e0001") == ('<bdi><span class="ctrl" title="LANGUAGE TAG">'
                                         "U+E0001</span></bdi>")
        value = {"a": f"{RLO}\U000e0001\x00\n", "b": [1, 2]}
        assert compact(value) == '{"a": "\\u202e\\udb40\\udc01\\u0000\\n", "b": [1, 2]}'
        assert json.loads(pretty(value)) == value  # the escapes are JSON's own
