"""The form of every run.json field that names a file or reaches a command line, checked when
the record is read back (`RunDir.record`).

Why: a run directory is anyone's (copied in, handed over, written by a node's collection), and
its run.json decides where the launcher writes and what it runs: `reproduce ssh` wrote the run's
known_hosts to `$REPRODUCE_HOME/ssh/<run_id>-node0.known_hosts`, so a `run_id` of `../../x` put
it anywhere the user can write; a `host` of `-oProxyCommand=...` is an option to ssh, a
`node_run_dir` of `/x; rm` a command's argument. Each such field has one form (FORMS), checked
wherever the key stands in the record (the nodes, their jump host, the cluster's record), so a
field added later under a known key is covered; a key that is none of these is data the
launcher only shows or compares (tests/records/test_record_forms.py holds every key of real
run.json files to this table). A field out of form is a damaged record: BadInput (exit 2)
naming the file, the field and the form, before anything is written or run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TypeGuard

from launcher.errors import BadInput

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a run id (records/state.py's form)
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")  # docker's container names
_HOST = re.compile(r"[A-Za-z0-9_.:\[\]%-]{1,255}")  # a DNS name, an IPv4 or [IPv6] address
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _id(value: object) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def _container(value: object) -> bool:
    return isinstance(value, str) and _CONTAINER.fullmatch(value) is not None


def _host(value: object) -> bool:
    return isinstance(value, str) and not value.startswith("-") and bool(_HOST.fullmatch(value))


def _user(value: object) -> bool:
    return isinstance(value, str) and _USER.fullmatch(value) is not None


def _path(value: object, *, absolute: bool) -> TypeGuard[str]:
    if not isinstance(value, str) or not value or _CONTROL.search(value):
        return False
    if value.startswith("-") or (absolute and not value.startswith("/")):
        return False
    return ".." not in PurePosixPath(value).parts


def _node_path(value: object) -> bool:
    """An absolute path on the node without ':' (the profile's nodePath) nor `..`."""
    return _path(value, absolute=True) and ":" not in value


def _local_path(value: object) -> bool:
    """A file on the launcher's machine (a key, a known_hosts): no `..`, no leading `-`."""
    return _path(value, absolute=False)


def _slug(value: object) -> bool:
    """The recipe's slug: a relative path of safe words (runs/<slug>/...)."""
    return (
        isinstance(value, str)
        and _path(value, absolute=False)
        and not value.startswith("/")
        and all(_CONTAINER.fullmatch(p) for p in value.split("/"))  # words of up to 255
    )


def _port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 65536


def _pid(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31


# key -> (its form, in words; the check). None is always allowed (a field not set).
FORMS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "run_id": ("a run id (letters, digits, '.', '_', '-'; no '/')", _id),
    "launch_id": ("a launch id (letters, digits, '.', '_', '-'; no '/')", _id),
    "slug": ("a recipe slug (words of letters, digits, '.', '_', '-' between '/')", _slug),
    "container": ("a container name (letters, digits, '.', '_', '-')", _container),
    "node_run_dir": ("an absolute path on the node without ':' or '..'", _node_path),
    "work_dir": ("an absolute path on the node without ':' or '..'", _node_path),
    "host": ("a host name or address (not starting with '-', no blanks)", _host),
    "connect_host": ("a host name or address (not starting with '-', no blanks)", _host),
    "user": ("a user name (letters, digits, '.', '_', '-', '@')", _user),
    "identity_file": ("a file path without '..' or control characters", _local_path),
    "known_hosts": ("a file path without '..' or control characters", _local_path),
    "state_path": ("a file path without '..' or control characters", _local_path),
    "port": ("a port number (1-65535)", _port),
    "pid": ("a process id (a positive integer)", _pid),
}


def check(record: object, path: Path) -> None:
    """BadInput naming the first field of `record` (run.json at `path`) out of its form."""
    problem = _first_problem(record, "", 0)
    if problem is not None:
        where, words = problem
        raise BadInput(
            f"{path}: field {where} is not {words}; the run's record is damaged (or was written "
            "by someone else). Nothing was run or written.",
            hint="Restore run.json from a backup, or look at the run directory by hand.",
        )


# What a recipe or profile names freely (its environment's variable names): data, not fields.
_DATA = frozenset({"env", "env_vars", "ray_job"})
_MAX_DEPTH = 16  # the record's own nesting is shallow (nodes -> via -> ...)


def _first_problem(value: object, where: str, depth: int) -> tuple[str, str] | None:
    if depth > _MAX_DEPTH:
        return where, f"nested at most {_MAX_DEPTH} deep"
    if isinstance(value, dict):
        for key, item in value.items():
            at = f"{where}.{key}" if where else str(key)
            if key in _DATA:
                continue
            form = FORMS.get(key)
            if form is not None and item is not None and not form[1](item):
                return at, form[0]
            if isinstance(item, (dict, list)):
                found = _first_problem(item, at, depth + 1)
                if found is not None:
                    return found
    elif isinstance(value, list):
        for k, item in enumerate(value):
            found = _first_problem(item, f"{where}[{k}]", depth + 1)
            if found is not None:
                return found
    return None
