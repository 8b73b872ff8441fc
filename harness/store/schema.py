"""Result documents are checked on read against their published JSON Schema (results/schema/).

Every reader (compare, gate, promote, the baselines, report) goes through ``load_document`` or
``validate``: a file that is not JSON, lacks a field the readers need, holds a wrong type, or was
written by a newer gembench ends as one UsageError naming the file and the first bad field as a
JSON path (``$.runs[0].samples.step_s[3]``), instead of a KeyError deep inside a command or, worse,
an empty comparison that passes.

Where the schemas live: ``results/schema/<kind>-<version>.json`` (draft 2020-12), beside the
committed baselines. The package ``gembench`` *is* the repository root (pyproject's package-dir
maps it to "."), so the files are found relative to the package, ``Path(gembench.__file__).parent
/ "results" / "schema"``: in a checkout or an editable install that is the repository's own folder,
and a built wheel carries the same files as package data of ``gembench`` (no copy in the tree).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

from gembench.errors import UsageError

# document kind -> the one version this gembench reads; the schema file is <kind>-<version>.json
KNOWN = {"gembench.result": 1, "gembench.baseline": 1, "gembench.instructions": 1, "gembench.projection": 1}
VERSIONED = re.compile(r"^(?P<kind>gembench\.[a-z_]+)/(?P<version>\d+)$")


def schema_dir() -> Path:
    import gembench

    return Path(gembench.__file__).resolve().parent / "results" / "schema"


@functools.lru_cache(maxsize=None)
def _validators() -> dict:
    """One draft 2020-12 validator per known schema; the baseline's runs refer to the result's."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    schemas = {}
    for kind, version in KNOWN.items():
        path = schema_dir() / f"{kind.split('.', 1)[1]}-{version}.json"
        try:
            schemas[kind] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise UsageError(
                f"gembench's schema file {path} is missing or broken ({err}); reinstall gembench from its repository"
            ) from None
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas.values())
    return {kind: Draft202012Validator(s, registry=registry) for kind, s in schemas.items()}


def read_json(path: str | os.PathLike):
    """The parsed JSON of ``path``; unreadable or malformed files are one line naming the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"no result file {path}") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a folder; name result files (or a glob such as {path}/*.json)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"{path} is not a gembench result (bad JSON: {err})") from None
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror}") from None


def check_version(doc, path) -> str:
    """The document's kind ("gembench.result"), or a UsageError saying what it is instead."""
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: $ must be an object (a gembench result), got {_kind(doc)}")
    found = doc.get("schema")
    if found is None:
        raise UsageError(f"{path}: $.schema is missing: not a gembench result")
    match = VERSIONED.match(found) if isinstance(found, str) else None
    if match is None or match["kind"] not in KNOWN:
        readable = ", ".join(f"{k}/{v}" for k, v in KNOWN.items())
        raise UsageError(f"{path}: $.schema is {found!r}, expected {readable}: not a gembench result")
    kind, version, known = match["kind"], int(match["version"]), KNOWN[match["kind"]]
    if version > known:
        raise UsageError(
            f"{path}: $.schema is {found!r}, written by a newer gembench; this one reads "
            f"{kind}/{known}: upgrade gembench to read it"
        )
    if version < known:
        raise UsageError(f"{path}: $.schema is {found!r}, older than any this gembench reads ({kind}/{known})")
    return kind


def validate(doc, path: str | os.PathLike = "<document>") -> dict:
    """Check ``doc`` against the schema its ``schema`` field names; returns it unchanged.

    Raises UsageError "<path>: <JSON path>: <what is wrong>" for the most prominent error (the
    shallowest, as jsonschema's best_match ranks them), so a result with no runs names the
    missing top-level field rather than something deep inside it.
    """
    from jsonschema.exceptions import best_match

    kind = check_version(doc, path)
    error = best_match(_validators()[kind].iter_errors(doc))
    if error is not None:
        raise UsageError(f"{path}: {describe(error)} (schema {kind}/{KNOWN[kind]}, see results/schema/)")
    return doc


def load_document(path: str | os.PathLike) -> dict:
    """Read and validate a result or baseline file."""
    return validate(read_json(path), path)


def describe(error) -> str:
    """One short phrase for a jsonschema error: the JSON path of the bad field and what is wrong."""
    where = error.json_path
    if error.validator == "required":
        missing = [name for name in error.validator_value if name not in error.instance]
        more = f" (also missing: {', '.join(missing[1:])})" if len(missing) > 1 else ""
        return f"{_join(where, missing[0])} is missing{more}"
    if error.validator == "type":
        wanted = error.validator_value
        wanted = " or ".join(wanted) if isinstance(wanted, list) else wanted
        shown = _short(error.instance)
        return f"{where} must be {_article(wanted)}, got {_kind(error.instance)}{' ' + shown if shown else ''}"
    if error.validator == "const":
        return f"{where} must be {error.validator_value!r}, got {_short(error.instance) or _kind(error.instance)}"
    if error.validator in ("minItems", "maxItems"):
        return (
            f"{where} must hold {'at least' if error.validator == 'minItems' else 'at most'} "
            f"{error.validator_value} item(s), holds {len(error.instance)}"
        )
    message = error.message if len(error.message) <= 120 else error.message[:117] + "..."
    return f"{where}: {message}"


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"{where}[{name!r}]"


def _article(type_name: str) -> str:
    return f"an {type_name}" if type_name[0] in "aeiou" else f"a {type_name}"


def _kind(value) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)


def _short(value) -> str:
    if isinstance(value, (dict, list)) or value is None:
        return ""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
