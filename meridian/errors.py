"""Everyday mistakes said in one line: what is wrong and what to do next, never a traceback.

A command raises :class:`UserError` (a message and a hint) for a mistake the operator can fix; the
root command (:mod:`meridian.cli`) prints it as ``error: <message>; <hint>`` on stderr and exits 2.
Some mistakes surface as a library's exception far from any command, and :func:`describe` turns
those into the same line: a ``MERIDIAN_*`` variable that is not valid JSON or not of its type (named
by the variable, with the expected form), Redis unreachable, a port already taken, a traces folder
that is not there. ``meridian --verbose …`` shows the traceback instead. docs/errors.md lists each
mistake with the line it prints and the test that checks it.

Only the standard library is imported here: the command tree is built on every start
(tests/cli/test_cli_startup.py). The classes :func:`describe` knows are looked up in
``sys.modules``: a module that was never imported cannot have raised its exception.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import sys
import types
import typing
from typing import Any

#: The exit status of a command stopped by a user error (click's, for a bad option, is 2 as well).
USER_ERROR_EXIT = 2


class UserError(Exception):
    """A mistake the operator can fix: ``message`` says what is wrong, ``hint`` what to do next."""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


def one_line(text: object) -> str:
    """``text`` with its line breaks and runs of blanks made single spaces."""
    return " ".join(str(text).split())


# ------------------------------------------------------------------------------------------ ports
def bind_error(exc: OSError, *, what: str, host: str, port: int, setting: str) -> UserError:
    """The mistake behind an ``OSError`` from binding ``host:port``; ``setting`` is how to choose another."""
    where = f"{host or '*'}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return UserError(f"{what} port {port} is already in use ({where})",
                         hint=f"stop what listens there, or choose another port with {setting}")
    if exc.errno == errno.EADDRNOTAVAIL:
        return UserError(f"{what} address {host} is not an address of this machine ({where})",
                         hint=f"choose another with {setting}")
    if exc.errno == errno.EACCES:
        return UserError(f"{what} port {port} needs privileges ({where}: ports below 1024 do)",
                         hint=f"choose a port above 1023 with {setting}")
    return UserError(f"{what} cannot listen on {where}: {one_line(exc.strerror or exc)}",
                     hint=f"choose another address or port with {setting}")


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` as (host, port); the port is 0 when it is not a number."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) if port.isdigit() else 0


def why_bind_fails(host: str, port: int) -> OSError | None:
    """Bind ``host:port`` as a server would (``SO_REUSEADDR``) and close it again: why a library that
    reports only "failed to bind" (gRPC) would fail, or None when it could listen now. As gRPC does, a
    name that resolves to several addresses fails only when none of them can be bound."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return OSError(errno.EADDRNOTAVAIL, f"cannot resolve {host!r}: {exc.strerror}")
    first: OSError | None = None
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                first = first or exc
            else:
                return None
    return first


def check_listen(address: str, *, what: str, setting: str) -> None:
    """Raise :class:`UserError` when ``address`` (``host:port``; port 0 is always free) cannot be listened on
    now: the port in use, an address not this machine's. ``setting`` says how to choose another."""
    host, _, port_text = address.rpartition(":")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise UserError(f"{what} address {address!r} is not host:port", hint=f"write e.g. 127.0.0.1:50051 in {setting}")
    host, port = split_host_port(address)
    refused = why_bind_fails(host, port) if port else None
    if refused is not None:
        raise bind_error(refused, what=what, host=host, port=port, setting=setting)


# --------------------------------------------------------------------------------------- settings
def _settings_classes() -> list[type]:
    """Every pydantic-settings class defined so far (a settings error can only come from one of them)."""
    module = sys.modules.get("pydantic_settings")
    if module is None:
        return []
    found, todo = [], list(module.BaseSettings.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def _env_names(cls: type) -> tuple[str, str, bool]:
    config = cls.model_config  # type: ignore[attr-defined]
    return config.get("env_prefix", ""), config.get("env_nested_delimiter") or "", config.get("case_sensitive", False)


def _environ(case_sensitive: bool) -> dict[str, tuple[str, str]]:
    """Lookup key → (the variable's own name, its value)."""
    return {(k if case_sensitive else k.upper()): (k, v) for k, v in os.environ.items()}


def _unwrap(annotation: Any) -> Any:
    """``X | None`` → ``X``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _annotation_at(cls: type, path: list[str]) -> Any:
    """The type of the field that ``path`` (lower-case names) reaches from ``cls``, or None."""
    model: Any = cls
    annotation: Any = None
    for name in path:
        fields = getattr(model, "model_fields", None)
        if not fields:
            return None
        match = next((f for n, f in fields.items() if n.lower() == name), None)
        if match is None:
            return None
        annotation = _unwrap(match.annotation)
        model = annotation
    return annotation


def _json_example(annotation: Any, value: str) -> tuple[str, str] | None:
    """(what to write, an example) for a field read as JSON, or None for a field read as plain text."""
    origin = typing.get_origin(annotation) or annotation
    if origin in (list, tuple, set, frozenset):
        items = [item.strip() for item in value.split(",") if item.strip()]
        numbers = all(re.fullmatch(r"-?\d+(\.\d+)?", item) for item in items) and items
        return "a JSON list", json.dumps([float(i) if "." in i else int(i) for i in items] if numbers else items)
    if origin is dict or hasattr(origin, "model_fields"):
        return "a JSON object", '{"name": "value"}'
    return None


def _not_json(exc: Exception) -> UserError | None:
    """A pydantic-settings ``SettingsError`` ("error parsing value for field …"): the variable whose value
    should be JSON and is not, with the form to write."""
    field = re.search(r'field "([^"]+)"', str(exc))
    if field is None:
        return None
    for cls in _settings_classes():
        prefix, delimiter, case_sensitive = _env_names(cls)
        if not prefix:
            continue
        environ = _environ(case_sensitive)
        stem = (prefix + field.group(1)) if case_sensitive else (prefix + field.group(1)).upper()
        for key, (name, value) in sorted(environ.items()):
            if key != stem and not (delimiter and key.startswith(stem + delimiter)):
                continue
            path = key[len(prefix):].lower().split(delimiter.lower()) if delimiter else [key[len(prefix):].lower()]
            expected = _json_example(_annotation_at(cls, path), value)
            if expected is None:
                continue
            try:
                json.loads(value)
            except ValueError:
                form, example = expected
                return UserError(f"{name} is not valid JSON", hint=f"write {form}: {name}='{example}'")
    return None


def _invalid_setting(exc: Exception) -> UserError | None:
    """A pydantic ``ValidationError`` raised by a settings class: the variable (or setting) and why."""
    classes = {cls.__name__: cls for cls in _settings_classes()}
    cls = classes.get(getattr(exc, "title", ""))
    if cls is None:
        return None
    errors = exc.errors()  # type: ignore[attr-defined]
    if not errors:
        return None
    first = errors[0]
    prefix, delimiter, case_sensitive = _env_names(cls)
    loc = [str(part) for part in first.get("loc", ())]
    candidate = prefix + (delimiter or "__").join(loc)
    environ = _environ(case_sensitive)
    found = environ.get(candidate if case_sensitive else candidate.upper())
    from meridian.bus.settings import StreamConsumerSettings

    # A stream consumer's setting may be spelt flat (``<PREFIX>BLOCK_MS``) as well as nested.
    flat = ({new: old for old, new in cls.flat_bus_names.items()} if issubclass(cls, StreamConsumerSettings)
            else {})
    if found is None and len(loc) >= 2 and loc[0] == "bus" and loc[1] in flat:
        candidate = prefix + flat[loc[1]]  # the flat spelling of that setting
        found = environ.get(candidate if case_sensitive else candidate.upper())
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if found is not None:
        name, value = found
        return UserError(f"{name}={value!r} is not valid: {one_line(first.get('msg', ''))}{more}",
                         hint=f"fix or unset {name}")
    return UserError(f"setting {'.'.join(loc)}={first.get('input')!r} is not valid: "
                     f"{one_line(first.get('msg', ''))}{more}", hint="fix the option or variable that sets it")


# ----------------------------------------------------------------------------------------- top level
def _instance_of(exc: BaseException, module: str, name: str) -> bool:
    cls = getattr(sys.modules.get(module), name, None)
    return cls is not None and isinstance(exc, cls)


def describe(exc: BaseException) -> UserError | None:
    """``exc`` as a user error when it is an everyday mistake, else None (a bug: keep the traceback)."""
    if isinstance(exc, UserError):
        return exc
    if _instance_of(exc, "pydantic_settings", "SettingsError"):
        return _not_json(exc) or UserError(one_line(exc), hint="check the MERIDIAN_* environment variables")
    if _instance_of(exc, "pydantic_core", "ValidationError"):
        return _invalid_setting(exc)
    if _instance_of(exc, "meridian.bus.base", "BusAuthenticationError") or _instance_of(exc, "meridian.bus.base",
                                                                                         "BusConfigError"):
        return UserError(one_line(exc))  # the message names the user, the file or the URL at fault
    if _instance_of(exc, "meridian.bus.base", "BusUnavailableError") or _instance_of(exc, "redis.exceptions",
                                                                                      "ConnectionError"):
        return UserError(f"Redis unreachable: {one_line(exc)}",
                         hint="start Redis there, or point the command at a running one (its bus URL option, "
                              "see --help)")
    if _instance_of(exc, "meridian.traces", "TracesNotFoundError"):
        return UserError(one_line(exc))  # names the folder looked in and the variable that moves it
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return UserError(f"a port this command listens on is already in use ({one_line(exc)})",
                         hint="stop what listens there, or choose another port (see --help)")
    return None
