"""The console link ``taskfleet dev`` prints: the API's ``/ui/`` with the token in the fragment.

The fragment (after ``#``) never leaves the browser, so the token is not sent in a URL; the
console moves it into the tab's sessionStorage and out of the address bar (docs/console.md).
"""

from __future__ import annotations

from urllib.parse import quote


def console_url(api_base: str, token: str | None) -> str:
    """``<api_base>/ui/``, signed in with ``token`` when there is one."""
    url = f"{api_base.rstrip('/')}/ui/"
    return f"{url}#token={quote(token, safe='')}" if token else url
