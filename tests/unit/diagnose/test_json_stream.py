"""The streamed JSON reader (``JsonStream``) against the standard library's ``json.loads``: the
same values from arrays written every way (indented as the Trainer writes, compact, odd
whitespace, nested, empty) wherever the chunks happen to end, and the same refusals (truncated,
a bad separator, a value over the bound) naming the character."""

from __future__ import annotations

import io
import json
import random

import pytest

from rlmon.service.diagnose.readers import json_stream
from rlmon.service.diagnose.readers.json_stream import JsonStream, JsonStreamError


def _entries(seed: int, count: int) -> list[object]:
    rng = random.Random(seed)
    entries: list[object] = []
    for step in range(count):
        entry: dict[str, object] = {"loss": rng.gauss(0.0, 1.0), "step": step,
                                    "learning_rate": 10.0 ** -rng.randint(3, 9)}
        if rng.random() < 0.2:
            entry["note"] = rng.choice(["a, b]", "x\n", "", "[1, 2]", "1."])
        if rng.random() < 0.1:
            entry["nested"] = [[rng.random()], {"k": [1, 2, {"z": None}]}]
        entries.append(entry if rng.random() < 0.95 else rng.choice([12345, "text", None, []]))
    return entries


def _read(text: str) -> list[object]:
    with JsonStream(io.BytesIO(text.encode())) as stream:
        for key in stream.object_items():
            if key == "log_history":
                return list(stream.array_items())
            stream.value()
    raise AssertionError("no log_history")


def _read_into(text: str, read: list[object]) -> None:
    with JsonStream(io.BytesIO(text.encode())) as stream:
        for key in stream.object_items():
            assert key == "log_history"
            read.extend(stream.array_items())


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
@pytest.mark.parametrize("layout", ["indent", "compact", "spaces"])
def test_each_element_is_what_json_reads_wherever_the_chunks_end(
        chunk: int, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_stream, "_CHUNK", chunk)
    history = _entries(chunk, 60)
    state = {"global_step": 60, "log_history": history, "max_steps": 60}
    if layout == "indent":
        text = json.dumps(state, indent=2, sort_keys=True)
    elif layout == "compact":
        text = json.dumps(state, separators=(",", ":"))
    else:
        text = json.dumps(state, separators=(" \n\t ,\r\n ", " : "))
    assert json.loads(text)["log_history"] == history
    assert _read(text) == history


@pytest.mark.parametrize("chunk", [1, 5, 1 << 20])
@pytest.mark.parametrize("array", ["[]", "[ ]", "[\n  ]", "[1]", "[ 1 , 2 ]", "[1.5e3,-2,3]"])
def test_short_arrays(array: str, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_stream, "_CHUNK", chunk)
    assert _read('{"log_history": ' + array + "}") == json.loads(array)


@pytest.mark.parametrize("chunk", [1, 3, 1 << 20])
@pytest.mark.parametrize(("text", "before", "message"), [
    ('{"log_history": [1, 2', [1, 2], "expected ']' at character 21, found the end (truncated?)"),
    ('{"log_history": [1, 2,', [1, 2], "not complete JSON (truncated?): Expecting value at "
                                       "character 22"),
    ('{"log_history": [1, {"a": 2', [1], "not complete JSON (truncated?)"),
    ('{"log_history": [1 2]}', [1], "expected ']' at character 19, found '2'"),
    ('{"log_history": [1, 2;]}', [1, 2], "expected ']' at character 21, found ';'"),
    ('{"log_history": [1, , 2]}', [1], "Expecting value at character 20"),
    ('{"log_history": [1, 2.]}', [1, 2], "expected ']' at character 21, found '.'"),
])
def test_a_broken_array_is_refused_at_its_character(text: str, before: list[object],
                                                    message: str, chunk: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_stream, "_CHUNK", chunk)
    read: list[object] = []
    with pytest.raises(JsonStreamError) as raised:
        _read_into(text, read)
    assert message in str(raised.value)
    assert read == before  # the elements before the break are handed out first


@pytest.mark.parametrize("chunk", [1, 2, 3, 1 << 20])
@pytest.mark.parametrize("number", ["1.5", "1e5", "1E-5", "-0.25e+3", "123456", "-7"])
def test_a_number_cut_by_a_chunk_is_read_whole(number: str, chunk: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # "1." or "1e" at a chunk's end is no number yet: the reader reads on
    monkeypatch.setattr(json_stream, "_CHUNK", chunk)
    text = '{"log_history": [' + number + ", " + number + '], "total_flos": ' + number + "}"
    with JsonStream(io.BytesIO(text.encode())) as stream:
        values = []
        for key in stream.object_items():
            if key == "log_history":
                values.extend(stream.array_items())
            else:
                values.append(stream.value())
    assert values == [json.loads(number)] * 3


def test_an_element_over_the_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_stream, "_CHUNK", 16)
    text = '{"log_history": [1, "' + "x" * 200 + '"]}'
    with JsonStream(io.BytesIO(text.encode()), max_value=100) as stream:
        for _ in stream.object_items():
            items = stream.array_items()
            assert next(items) == 1
            with pytest.raises(JsonStreamError, match="longer than 100 characters: refused"):
                next(items)
            break
