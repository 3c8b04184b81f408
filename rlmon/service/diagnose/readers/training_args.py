"""The settings in a checkpoint's ``training_args.bin``, read without unpickling it.

The Hugging Face Trainer saves its ``TrainingArguments`` beside ``trainer_state.json`` with
``torch.save``: a zip holding a pickle. Loading a pickle runs whatever code it names, so a file
someone sent is never loaded here; its opcodes are only listed (``pickletools.genops``, which
executes nothing) and each string key directly followed by a plain number, string or boolean is
taken as a field and its value. What is not such a pair (an enum, a nested object) is skipped.
"""

from __future__ import annotations

import pickletools
import zipfile
from pathlib import Path
from typing import Any

__all__ = ["FILE_NAME", "read_training_args"]

FILE_NAME = "training_args.bin"
_MAX_BYTES = 16 << 20
_MEMO = frozenset({"MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"})
_STRINGS = frozenset({"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8"})
_SCALARS = _STRINGS | {"BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG", "BINFLOAT",
                       "FLOAT", "NEWTRUE", "NEWFALSE", "NONE"}
_CONSTANTS = {"NEWTRUE": True, "NEWFALSE": False, "NONE": None}


def _pickle_bytes(path: Path) -> bytes:
    if path.stat().st_size > _MAX_BYTES:
        raise ValueError(f"larger than {_MAX_BYTES >> 20} MiB")
    if not zipfile.is_zipfile(path):
        raise ValueError("not the zip torch.save writes (an older torch's format is not read)")
    with zipfile.ZipFile(path) as archive:
        name = next((n for n in archive.namelist() if n.endswith("/data.pkl")
                     or n == "data.pkl"), None)
        if name is None:
            raise ValueError("no data.pkl in the archive")
        return archive.read(name)


def read_training_args(path: Path) -> dict[str, Any]:
    """The plain fields of the pickled arguments (first occurrence of a key wins); ValueError
    names what is wrong with a file that is not such an archive."""
    try:
        data = _pickle_bytes(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"cannot read: {exc}") from None
    fields: dict[str, Any] = {}
    key: str | None = None
    try:
        for opcode, arg, _ in pickletools.genops(data):
            name = opcode.name
            if name in _MEMO:
                continue
            if key is not None and name in _SCALARS and key not in fields:
                fields[key] = _CONSTANTS.get(name, arg)
                key = None
                continue
            key = arg if name in _STRINGS else None
    except Exception as exc:  # a damaged stream: keep the fields read before it
        if not fields:
            raise ValueError(f"not a pickle stream: {exc}") from None
    return fields
