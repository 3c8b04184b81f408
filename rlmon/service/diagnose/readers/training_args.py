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
import zlib
from pathlib import Path
from typing import Any

from rlmon.service.input_files import InputFileError, open_regular

__all__ = ["FILE_NAME", "read_training_args"]

FILE_NAME = "training_args.bin"
_MAX_BYTES = 16 << 20  # the file, and the pickle inflated from it (a few KiB in practice)
_CHUNK = 1 << 16
_MEMO = frozenset({"MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"})
_STRINGS = frozenset({"BINUNICODE", "SHORT_BINUNICODE", "UNICODE", "BINUNICODE8"})
_SCALARS = _STRINGS | {"BININT", "BININT1", "BININT2", "LONG1", "INT", "LONG", "BINFLOAT",
                       "FLOAT", "NEWTRUE", "NEWFALSE", "NONE"}
_CONSTANTS = {"NEWTRUE": True, "NEWFALSE": False, "NONE": None}


def _pickle_bytes(path: Path) -> bytes:
    """The archive's ``data.pkl``, its declared size checked before inflating it and the bytes
    inflated counted chunk by chunk (a zip bomb's header may lie), both against the cap."""
    with open_regular(path, _MAX_BYTES) as handle:
        if not zipfile.is_zipfile(handle):
            raise ValueError("not the zip torch.save writes (an older torch's format is not "
                             "read)")
        with zipfile.ZipFile(handle) as archive:
            info = next((i for i in archive.infolist() if i.filename.endswith("/data.pkl")
                         or i.filename == "data.pkl"), None)
            if info is None:
                raise ValueError("no data.pkl in the archive")
            if info.file_size > _MAX_BYTES:
                raise ValueError(f"its data.pkl inflates to {info.file_size} bytes, more than "
                                 f"the {_MAX_BYTES >> 20} MiB read: refused")
            parts, total = [], 0
            with archive.open(info) as member:
                while chunk := member.read(_CHUNK):
                    total += len(chunk)
                    if total > _MAX_BYTES:
                        raise ValueError(f"its data.pkl inflates past the {_MAX_BYTES >> 20} "
                                         "MiB read: refused")
                    parts.append(chunk)
            return b"".join(parts)


def read_training_args(path: Path) -> dict[str, Any]:
    """The plain fields of the pickled arguments (first occurrence of a key wins); ValueError
    names what is wrong with a file that is not such an archive."""
    try:
        data = _pickle_bytes(path)
    except InputFileError as exc:
        raise ValueError(exc.message) from None
    except (OSError, zipfile.BadZipFile, EOFError, NotImplementedError, RuntimeError,
            zlib.error) as exc:
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
