"""``bounded_lines``: a stream's lines as a text editor counts them (a final newline ends the last
line, it does not start another), an over-long line skipped unread, at any chunk boundary."""

from __future__ import annotations

import io

import pytest

from rlmon.service import input_files
from rlmon.service.input_files import LineTooLong, bounded_lines


@pytest.mark.parametrize(("data", "lines"), [
    (b"", []),
    (b"\n", [b""]),
    (b"a\nb\n", [b"a", b"b"]),
    (b"a\nb", [b"a", b"b"]),
    (b"a\n\nb\n", [b"a", b"", b"b"]),
    (b"a\n\n", [b"a", b""]),
])
@pytest.mark.parametrize("chunk", [1, 2, 3, 64])
def test_lines_are_counted_as_written(data: bytes, lines: list[bytes], chunk: int,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(input_files, "CHUNK", chunk)
    assert list(bounded_lines(io.BytesIO(data), 100)) == lines


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_an_over_long_line_is_one_line_with_its_size(chunk: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(input_files, "CHUNK", chunk)
    got = list(bounded_lines(io.BytesIO(b"ok\n" + b"x" * 20 + b"\nend\n"), 10))
    assert got[0] == b"ok" and got[2] == b"end" and len(got) == 3
    assert isinstance(got[1], LineTooLong)
