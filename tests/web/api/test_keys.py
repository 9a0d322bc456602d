"""API keys: stored as a hash, checked, revoked, expiring; made by the admin and by
create_api_key; the roles the data migration makes; the one access module."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command
from django.test import TestCase
from django.utils import timezone

from stateguard_web.accounts import access, services
from stateguard_web.accounts.access import Ability
from stateguard_web.accounts.models import ApiKey
from stateguard_web.runs.selectors import RunNotFound
from stateguard_web.sagas.models import AuditEvent, Run
from tests.web.api.world import make_user

KEY_SHAPE = re.compile(r"sg_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


class KeyTests(TestCase):
    def setUp(self) -> None:
        self.alice = make_user("alice", "submitter")

    def test_it_stores_only_the_prefix_and_a_hash(self) -> None:
        key, raw = services.api_key_create(user=self.alice, name="billing")
        assert KEY_SHAPE.fullmatch(raw) and raw.startswith(key.prefix + "_")
        stored = ApiKey.objects.get()
        assert stored.hashed == hashlib.sha256(raw.encode()).hexdigest()
        assert raw not in str(list(ApiKey.objects.values()))
        assert services.api_key_authenticate(raw, address=None).user == self.alice

    def test_it_refuses_wrong_revoked_expired_and_inactive_keys(self) -> None:
        key, raw = services.api_key_create(user=self.alice, name="billing")
        for wrong in ["", "sg_", raw[:-1], raw[:-1] + ("A" if raw[-1] != "A" else "B"),
                      "sg_00000000_" + raw[12:], raw + "\x00", "Bearer " + raw]:
            with self.subTest(key=wrong), pytest.raises(services.KeyRefused,
                                                        match="invalid API key"):
                services.api_key_authenticate(wrong, address=None)
        with time_machine.travel(timezone.now() + timedelta(days=1)):
            key.expires_at = timezone.now()
            key.save()
            with pytest.raises(services.KeyRefused, match="expired"):
                services.api_key_authenticate(raw, address=None)
        key.expires_at = None
        key.save()
        assert services.api_key_revoke(key=key, by="carol")
        assert not services.api_key_revoke(key=key, by="carol")  # once
        with pytest.raises(services.KeyRefused, match="revoked"):
            services.api_key_authenticate(raw, address=None)
        _, other = services.api_key_create(user=make_user("gone", is_active=False), name="x")
        with pytest.raises(services.KeyRefused, match="inactive"):
            services.api_key_authenticate(other, address=None)
        assert [e.action for e in AuditEvent.objects.order_by("pk")] == [
            "api_key.created", "api_key.revoked", "api_key.created"]

    def test_it_reads_the_users_permissions_with_the_key_and_keeps_them_until_a_change(
            self) -> None:
        _, raw = services.api_key_create(user=self.alice, name="billing")
        with self.assertNumQueries(2):  # the key, its user and permissions; its first use
            services.api_key_authenticate(raw, address=None)
        with self.assertNumQueries(0):  # this process's key cache (accounts/keycache.py)
            user = services.api_key_authenticate(raw, address=None).user
            assert access.may(user, Ability.SUBMIT) and not access.may(user, Ability.OPERATE)
        assert user.get_all_permissions() == {"sagas.submit_run"}
        self.alice.groups.clear()  # the role taken away counts from the next request
        assert not access.may(services.api_key_authenticate(raw, address=None).user,
                              Ability.SUBMIT)
        root = get_user_model().objects.create_superuser("root")
        _, raw = services.api_key_create(user=root, name="all")
        services.api_key_authenticate(raw, address=None)
        with self.assertNumQueries(0):  # a superuser's permissions: all, asked of nobody
            assert access.may(services.api_key_authenticate(raw, address=None).user,
                              Ability.OPERATE)

    def test_it_records_the_last_use_at_most_once_a_minute(self) -> None:
        key, raw = services.api_key_create(user=self.alice, name="billing")
        start = timezone.now()
        with time_machine.travel(start, tick=False):
            with self.assertNumQueries(2):  # the key, and the one write
                services.api_key_authenticate(raw, address=None)
            with self.assertNumQueries(0):  # the key from the cache, no write
                services.api_key_authenticate(raw, address=None)
        with time_machine.travel(start + timedelta(seconds=59), tick=False):
            services.api_key_authenticate(raw, address=None)
        key.refresh_from_db()
        assert key.last_used_at == start
        with time_machine.travel(start + timedelta(seconds=61), tick=False):
            services.api_key_authenticate(raw, address=None)
        key.refresh_from_db()
        assert key.last_used_at == start + timedelta(seconds=61)


class RoleTests(TestCase):
    def test_it_makes_the_roles_from_permissions(self) -> None:
        perms = {group.name: sorted(p.codename for p in group.permissions.all())
                 for group in Group.objects.all()}
        assert perms == {"viewer": ["view_run"], "submitter": ["submit_run"],
                         "operator": ["operate_run", "refund_effect", "view_run"]}

    def test_it_answers_who_may_do_what_to_which_run(self) -> None:
        alice, bob = make_user("alice", "submitter"), make_user("bob", "submitter")
        vera, charlie = make_user("vera", "viewer"), make_user("charlie", "operator")
        nobody = make_user("nobody")
        root = get_user_model().objects.create_superuser("root")
        run = Run.objects.create(agent="provision", submitted_by=alice)
        table = {  # user: (view it, submit, operate it, runs it sees)
            alice: (True, True, False, 1), bob: (False, True, False, 0),
            vera: (True, False, False, 1), charlie: (True, False, True, 1),
            nobody: (False, False, False, 0), root: (True, True, True, 1),
        }
        for user, (view, submit, operate, seen) in table.items():
            with self.subTest(user=user.username):
                assert access.may(user, Ability.VIEW, run) is view
                assert access.may(user, Ability.SUBMIT) is submit
                assert access.may(user, Ability.OPERATE, run) is operate
                assert access.visible_runs(user).count() == seen
        with pytest.raises(RunNotFound):
            access.check(bob, Ability.VIEW, run)  # someone else's: as if not there
        with pytest.raises(access.PermissionDenied):
            access.check(nobody, Ability.VIEW, run)
        with pytest.raises(access.PermissionDenied):
            access.check(alice, Ability.OPERATE, run)

    def test_it_reads_permissions_granted_one_by_one(self) -> None:
        from django.contrib.auth.models import Permission

        dana = make_user("dana")
        dana.user_permissions.add(Permission.objects.get(codename="operate_run"))
        dana = get_user_model().objects.get(pk=dana.pk)  # a fresh permission cache
        assert access.may(dana, Ability.OPERATE) and access.may(dana, Ability.VIEW)


class CreateApiKeyTests(TestCase):
    def test_it_makes_a_service_user_in_the_role_and_prints_the_key_once(self) -> None:
        out, err = StringIO(), StringIO()
        call_command("create_api_key", "billing-bot", "--role", "submitter",
                     "--expires-in", "30", stdout=out, stderr=err)
        raw = out.getvalue().strip()
        assert KEY_SHAPE.fullmatch(raw)  # stdout: the key alone, for $(...)
        assert raw not in err.getvalue() and "billing-bot" in err.getvalue()
        key = services.api_key_authenticate(raw, address=None)
        assert key.user.username == "billing-bot" and not key.user.has_usable_password()
        assert list(key.user.groups.values_list("name", flat=True)) == ["submitter"]
        assert timedelta(days=29) < key.expires_at - timezone.now() <= timedelta(days=30)

        # Again: the user is there; a second key, no second user.
        call_command("create_api_key", "billing-bot", "--role", "submitter",
                     stdout=StringIO(), stderr=StringIO())
        assert get_user_model().objects.filter(username="billing-bot").count() == 1
        assert ApiKey.objects.filter(user=key.user).count() == 2

    def test_it_refuses_bad_arguments(self) -> None:
        for args in (["x", "--role", "admin"], ["x", "--role", "viewer", "--expires-in", "0"]):
            with self.subTest(args=args), pytest.raises(CommandError):
                call_command("create_api_key", *args, stdout=StringIO(), stderr=StringIO())
        assert not ApiKey.objects.exists()


class KeyAdminTests(TestCase):
    def setUp(self) -> None:
        self.root = get_user_model().objects.create_superuser("root", password="pw")
        self.client.force_login(self.root)
        self.alice = make_user("alice", "submitter")

    def test_it_shows_a_new_key_once_and_stores_its_hash(self) -> None:
        response = self.client.post("/admin/accounts/apikey/add/",
                                    {"user": self.alice.pk, "name": "billing"})
        assert response.status_code == 200
        (raw,) = KEY_SHAPE.findall(response.content.decode())
        key = ApiKey.objects.get()
        assert key.user == self.alice and key.prefix in raw
        assert services.api_key_authenticate(raw, address=None) == key
        page = self.client.get(f"/admin/accounts/apikey/{key.pk}/change/").content.decode()
        assert key.prefix in page and raw not in page

    def test_it_revokes_keys_and_deletes_none(self) -> None:
        key, raw = services.api_key_create(user=self.alice, name="billing")
        self.client.post("/admin/accounts/apikey/",
                         {"action": "revoke", "_selected_action": [key.pk]})
        key.refresh_from_db()
        assert key.revoked_at is not None
        with pytest.raises(services.KeyRefused, match="revoked"):
            services.api_key_authenticate(raw, address=None)
        response = self.client.post(f"/admin/accounts/apikey/{key.pk}/delete/", {"post": "yes"})
        assert response.status_code == 403 and ApiKey.objects.filter(pk=key.pk).exists()
