"""Bearer-token authentication with two roles (docs/reference.md#authentication).

``submit`` creates and reads tasks; ``admin`` can do everything ``submit`` can, plus cancel, the
fleet view and runtime config. Routes declare what they need with
``dependencies=[Depends(require_role("admin"))]`` (or take the :class:`Principal` as a
parameter). Tokens are compared in constant time against every configured token, and never
logged.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

Role = Literal["submit", "admin"]

# What each role may do, as a rank: a role satisfies every requirement of rank <= its own.
_RANK: dict[str, int] = {"submit": 1, "admin": 2}


@dataclass(frozen=True)
class Principal:
    """Who made the request: the role of the token presented (``admin`` when auth is off)."""

    role: str


class Authenticator:
    """Maps a presented bearer token to its role."""

    def __init__(self, tokens: Mapping[str, str], *, disabled: bool = False) -> None:
        self.disabled = disabled
        self._tokens = [(token.encode(), role) for token, role in tokens.items()]

    def role_for(self, presented: str) -> str | None:
        candidate = presented.encode()
        role: str | None = None
        # No early exit: every configured token is compared, so the time taken does not say
        # which one matched, or how many there are before it.
        for token, token_role in self._tokens:
            if hmac.compare_digest(candidate, token):
                role = token_role
        return role


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail=detail,
        headers={"WWW-Authenticate": "Bearer"},
    )


def _bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


# Declares the scheme in the OpenAPI document; the check itself is RoleRequirement.authorize.
_bearer_scheme = HTTPBearer(auto_error=False, description="Authorization: Bearer <token>")


class RoleRequirement:
    """A FastAPI dependency that admits a request whose token has ``role`` or a higher one."""

    def __init__(self, role: Role) -> None:
        if role not in _RANK:
            raise ValueError(f"unknown role {role!r}")
        self.role = role

    def authorize(self, request: Request) -> Principal:
        authenticator: Authenticator = request.app.state.api.authenticator
        if authenticator.disabled:
            _refuse_cross_site_write(request)
            return Principal(role="admin")
        token = _bearer_token(request)
        if token is None:
            raise _unauthorized("missing bearer token: send Authorization: Bearer <token>")
        role = authenticator.role_for(token)
        if role is None:
            raise _unauthorized("invalid bearer token")
        if _RANK[role] < _RANK[self.role]:
            raise HTTPException(
                status_code=status.HTTP_403_FORBIDDEN,
                detail=f"this endpoint needs the {self.role} role; the token has the {role} role",
            )
        return Principal(role=role)

    async def __call__(
        self,
        request: Request,
        _credentials: HTTPAuthorizationCredentials | None = Depends(_bearer_scheme),
    ) -> Principal:
        # async: a plain def dependency would hop to the thread pool on every request.
        return self.authorize(request)


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _refuse_cross_site_write(request: Request) -> None:
    """With authentication off, any web page the operator visits could make the browser send
    a write (a cancel or a retry needs no body, so no preflight): a write whose ``Origin`` is
    another site's is refused. Clients that are not browsers send no ``Origin``; the console is
    served by the API itself, on the same origin. (With tokens on, a browser has none to send.)"""
    if request.method in _SAFE_METHODS:
        return
    origin = request.headers.get("origin")
    if origin is None:
        return
    host = request.headers.get("host", "")
    if origin == "null" or urlsplit(origin).netloc.lower() != host.lower():
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail=f"a write from another site ({origin}) is refused while authentication is "
            "disabled (TASKFLEET_AUTH_DISABLED)",
        )


def require_role(role: Role) -> RoleRequirement:
    """The dependency for a route that needs ``role`` (``"submit"`` or ``"admin"``)."""
    return RoleRequirement(role)
