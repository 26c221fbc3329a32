"""Every page carries a Content-Security-Policy (issue 42, finding 10): scripts only
from the site itself, and a page's inline script only with the nonce made for that
response, so a script injected into a page does not run. The browser tests
(test_browser.py, test_tls_proxy.py) run the pages in Chromium under this policy."""

from __future__ import annotations

import re

import pytest
from django.test import Client

pytestmark = [pytest.mark.live, pytest.mark.django_db]


def test_each_page_allows_only_its_own_inline_script_by_a_fresh_nonce(bare_redis, django_user_model) -> None:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(django_user_model.objects.create_user("csp-reader", is_staff=True))
    seen = set()
    for path in ("/", "/dashboard/", "/login/", "/admin/", "/api/v1/docs"):
        response = client.get(path, follow=True)
        assert response.status_code == 200, path
        policy = response["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "object-src 'none'" in policy, policy
        assert (
            "frame-ancestors 'none'" in policy and "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]
        )
        page = response.content.decode()
        inline = re.findall(r"<script(?![^>]*\bsrc=)(?![^>]*application/json)([^>]*)>", page)
        for attributes in inline:
            nonce = re.search(r'nonce="([^"]+)"', attributes)
            assert nonce, f"{path}: an inline script without a nonce"
            assert f"'nonce-{nonce.group(1)}'" in policy, f"{path}: the script's nonce is not the policy's"
            seen.add(nonce.group(1))
    assert len(seen) >= 2, "pages with inline scripts share a nonce, or have none"
