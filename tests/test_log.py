"""The record format on disk."""

import base64
import errno
import json
import os
import re
import struct
import time
import warnings
import zlib

import numpy as np
import pytest

from cockpit_lite import log


def write_sample(path):
    writer = log.JSONLinesWriter(path, {"params": [{"name": "w", "shape": [2]}], "quantities": ["Loss"]})
    writer.append(0, {"Loss": 1.5, "layers": {"NormTest": [0.1, float("nan")]}, "flags": ["nonfinite_grad"],
                      "batch": {"size": 8, "accumulated": False, "passes": 1}})
    writer.append(0, {"GradHist1d": {"hist": np.array([1, 2]), "edges": np.array([-1.0, 0.0, 1.0])}})
    writer.append(1, {"GradHist2d": {"hist": np.ones((2, 3), dtype=int), "edges": [np.zeros(3), np.zeros(4)]}})
    writer.append(1, {"Loss": 1.25})
    writer.close()


def test_round_trip_merges_parts_of_a_step(tmp_path):
    write_sample(tmp_path / "run.jsonl")
    header, record = log.read_jsonl(tmp_path / "run.jsonl")
    assert header["version"] == log.FORMAT_VERSION and header["params"][0]["name"] == "w"
    assert record[0]["Loss"] == 1.5 and np.isnan(record[0]["layers"]["NormTest"][1])
    assert record[0]["flags"] == ["nonfinite_grad"]
    assert record[0]["batch"] == {"size": 8, "accumulated": False, "passes": 1}
    np.testing.assert_array_equal(record[0]["GradHist1d"]["hist"], [1, 2])
    assert record[1]["GradHist2d"]["hist"].shape == (2, 3) and len(record[1]["GradHist2d"]["edges"]) == 2
    assert log.layer_values(record[0], "NormTest")[0] == 0.1
    assert log.layer_values(record[1], "Loss") is None
    assert log.layer_values({"GradNorm": [0.5, 0.25]}, "GradNorm") == [0.5, 0.25]
    lines = _lines(tmp_path / "run.jsonl")  # arrays as nested lists in a JSON-lines log
    assert lines[2]["GradHist1d"] == {"hist": [1, 2], "edges": [-1.0, 0.0, 1.0]}
    assert lines[3]["GradHist2d"] == {"hist": [[1, 1, 1]] * 2, "edges": [[0.0] * 3, [0.0] * 4]}


def test_merge_combines_the_parts_of_a_step_without_repeating_a_flag_or_finding():
    """Three hand-made parts of step 3 (its key once a string): "layers" and "meta" merged key by key, "flags" and
    "findings" concatenated without what an earlier part already holds, any other key replaced by the later part."""
    record = {}
    log.merge(record, 3, {"flags": ["a"], "layers": {"X": [1.0]}, "meta": {"X": {"se": 0.5}}, "Loss": 1.0})
    log.merge(record, "3", {"flags": ["a", "b"], "findings": [{"kind": "k"}], "layers": {"Y": [2.0]},
                            "meta": {"Y": {}}, "Loss": 2.0})
    log.merge(record, 3, {"findings": [{"kind": "k"}, {"kind": "j"}]})
    assert record == {3: {"flags": ["a", "b"], "findings": [{"kind": "k"}, {"kind": "j"}],
                          "layers": {"X": [1.0], "Y": [2.0]}, "meta": {"X": {"se": 0.5}, "Y": {}}, "Loss": 2.0}}


def test_torn_last_line_is_skipped_with_one_warning(tmp_path):
    path = tmp_path / "run.jsonl"
    write_sample(path)
    text = path.read_text()
    path.write_text(text[: len(text) - 7])
    with pytest.warns(UserWarning, match=re.escape(f"{path}: last line (5) of a run segment is incomplete")) as caught:
        record = log.read(path)
    assert len(caught) == 1
    assert record[1].keys() == {"GradHist2d"}


def test_corruption_elsewhere_and_newer_versions_are_refused(tmp_path):
    path = tmp_path / "run.jsonl"
    write_sample(path)
    lines = path.read_text().split("\n")
    lines[2] = lines[2][:5]
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match="line 3"):
        log.read_jsonl(path)
    path.write_text(json.dumps({"format": log.FORMAT, "version": 99}) + "\n")
    with pytest.raises(ValueError, match="newer"):
        log.read_jsonl(path)


def test_json_file_layout(tmp_path):
    """Cockpit's ``write`` layout, in a folder made for it: steps in order, arrays (also inside
    lists) as json_tricks 3.17 writes these (C-ordered) arrays, read back as arrays."""
    hist = {"hist": np.arange(6.0).reshape(2, 3), "edges": np.array([0.0, 1.0, 2.0])}
    record = {3: {"Loss": 0.5, "GradNorm": [1.0, 2.0]},
              1: {"Loss": float("nan"), "GradHist1d": hist, "Custom": [np.array([7, 8], dtype=np.int64)]}}
    path = tmp_path / "new folder" / "r.json"
    log.write_json(path, record)
    data = json.loads(path.read_text())
    assert list(data) == ["1", "3"] and data["3"]["GradNorm"] == [1.0, 2.0]
    assert data["1"]["GradHist1d"] == {
        "hist": {"__ndarray__": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], "dtype": "float64", "shape": [2, 3], "Corder": True},
        "edges": {"__ndarray__": [0.0, 1.0, 2.0], "dtype": "float64", "shape": [3]}}
    assert data["1"]["Custom"] == [{"__ndarray__": [7, 8], "dtype": "int64", "shape": [2]}]
    read = log.read(path)
    assert np.isnan(read[1]["Loss"]) and np.array_equal(read[1]["GradHist1d"]["hist"], hist["hist"])


def test_a_json_file_is_one_segment(tmp_path):
    """``read`` of a ``.json`` file: its record for the segments that name its one run (0, -1), a list of it for
    ``"all"``; any other segment is refused, naming it."""
    path = tmp_path / "r.json"
    log.write_json(path, {0: {"Loss": 0.5}})
    assert log.read(path) == log.read(path, segment=0) == {0: {"Loss": 0.5}}
    assert log.read(path, segment="all") == [{0: {"Loss": 0.5}}]
    with pytest.raises(ValueError, match="holds one run; segment=1 does not exist"):
        log.read(path, segment=1)


def test_from_jsonable_makes_tagged_arrays_and_histograms_arrays():
    """The inverse of ``to_jsonable``: json_tricks' tagged arrays (anywhere) and histograms as lists become arrays
    (edges of floats, also from integers; a histogram without edges gets none); an array that is no array of
    numbers is refused naming its field."""
    value = log.from_jsonable({"GradHist1d": {"hist": [1, 2], "edges": [-1.0, 0.0, 1.0]},
                               "Custom": [{"__ndarray__": [[1, 2], [3, 4]], "dtype": "int64", "shape": [2, 2]}],
                               "Loss": 0.5})
    np.testing.assert_array_equal(value["GradHist1d"]["hist"], np.array([1, 2]))
    np.testing.assert_array_equal(value["GradHist1d"]["edges"], np.array([-1.0, 0.0, 1.0]))
    assert value["Custom"][0].shape == (2, 2) and value["Custom"][0][1, 0] == 3 and value["Loss"] == 0.5
    with pytest.raises(ValueError, match="field 'GradHist1d.hist'"):
        log.from_jsonable({"GradHist1d": {"hist": ["a"], "edges": [0.0, 1.0]}})
    value = log.from_jsonable({"GradHist1d": {"hist": [1, 2], "edges": [0, 1, 2]}, "Custom": {"hist": [3]}})
    edges = value["GradHist1d"]["edges"]
    assert isinstance(edges, np.ndarray) and edges.dtype == np.float64 and edges.tolist() == [0.0, 1.0, 2.0]
    assert set(value["Custom"]) == {"hist"} and value["Custom"]["hist"].tolist() == [3]
    with pytest.raises(ValueError, match="field 'GradHist1d.edges'"):
        log.from_jsonable({"GradHist1d": {"hist": [1], "edges": ["a", "b"]}})


def test_from_jsonable_makes_a_2d_histograms_edges_one_float_array_per_axis():
    """Edges listed per axis (integers here) become a list of float arrays, one per axis, under ``"edges"``; a bad
    axis is refused naming the field."""
    value = log.from_jsonable({"GradHist2d": {"hist": [[1, 2]], "edges": [[0, 1], [0, 1, 2]]}})["GradHist2d"]
    assert value.keys() == {"hist", "edges"} and isinstance(value["edges"], list)
    assert [(e.dtype, e.tolist()) for e in value["edges"]] == [(np.float64, [0.0, 1.0]), (np.float64, [0.0, 1.0, 2.0])]
    with pytest.raises(ValueError, match="field 'GradHist2d.edges': expected an array of numbers"):
        log.from_jsonable({"GradHist2d": {"hist": [[1, 2]], "edges": [[0, 1], ["a", "b", "c"]]}})


def test_from_jsonable_takes_the_limits_it_is_given():
    """A value nested three deep (``{"Custom": [[[1.0]]]}``) is read under the default limits and refused under
    ``limits={"max_depth": 2}``, naming the limit and how to raise it; five list elements are refused under
    ``max_items=3``."""
    nested = {"Custom": [[[1.0]]]}
    assert log.from_jsonable(nested) == nested
    with pytest.raises(ValueError, match=r"field 'Custom': values nested deeper than the limit max_depth=2; .*"
                                         r"limits=\{'max_depth': N\}"):
        log.from_jsonable(nested, limits={"max_depth": 2})
    with pytest.raises(ValueError, match="the limit max_items=3"):
        log.from_jsonable({"Custom": [1.0] * 5}, limits={"max_items": 3})


def test_an_unknown_reader_limit_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=re.escape("unknown reader limit(s) ['max_bytes', 'max_dpeth']; known: [")
                                         + ".*'max_depth'"):
        log.from_jsonable({"Loss": 1.0}, limits={"max_depth": 4, "max_dpeth": 4, "max_bytes": 1})


def test_the_depth_limit_counts_every_level_of_nested_lists_and_dicts():
    """``{"Custom": [[[1.0]]]}`` is four levels, the step's dict and three lists: read under ``max_depth=4``,
    refused under 3; so is ``{"Custom": {"a": {"b": {"c": 1.0}}}}``, four dicts."""
    for nested in ({"Custom": [[[1.0]]]}, {"Custom": {"a": {"b": {"c": 1.0}}}}):
        assert log.from_jsonable(nested, limits={"max_depth": 4}) == nested
        with pytest.raises(ValueError, match="field 'Custom.*': values nested deeper than the limit max_depth=3"):
            log.from_jsonable(nested, limits={"max_depth": 3})


def test_a_field_names_at_most_three_keys_before_a_histograms_own():
    """A bad histogram five dicts deep is named by the first three keys and its own: ``a.b.c.hist``."""
    with pytest.raises(ValueError, match=re.escape("field 'a.b.c.hist': expected an array of numbers")):
        log.from_jsonable({"a": {"b": {"c": {"d": {"hist": ["x"]}}}}})


def test_the_item_limit_counts_the_elements_of_nested_lists():
    """``{"Custom": [[1.0] * 3, [1.0] * 3]}`` holds 1 + 2 + 3 + 3 = 9 elements: read under ``max_items=9``,
    refused under 8."""
    nested = {"Custom": [[1.0] * 3, [1.0] * 3]}
    assert log.from_jsonable(nested, limits={"max_items": 9}) == nested
    with pytest.raises(ValueError, match="field 'Custom': more list and dict elements in one step than the limit "
                                         "max_items=8"):
        log.from_jsonable(nested, limits={"max_items": 8})


@pytest.mark.parametrize("shape", [[0], [1]])
def test_complex_histogram_counts_are_refused_even_when_empty(shape):
    """A histogram's counts are real numbers: a json_tricks array of complex128 counts is refused naming its field,
    an empty one (shape [0]) as well as one of one count; empty real counts (``[]``) are read."""
    tagged = {"__ndarray__": [1j] * shape[0], "dtype": "complex128", "shape": shape}
    with pytest.raises(ValueError, match="field 'GradHist1d.hist': expected an array of numbers"):
        log.from_jsonable({"GradHist1d": {"hist": tagged, "edges": [0.0]}})
    assert log.from_jsonable({"GradHist1d": {"hist": [], "edges": [0.0]}})["GradHist1d"]["hist"].shape == (0,)


def test_in_memory_histogram_counts_of_objects_are_taken_only_when_empty():
    """``from_jsonable`` of an in-memory value: counts held as an empty object array (no counts) are taken as they
    are, an object array holding a count is refused naming its field."""
    empty = np.array([], dtype=object)
    assert log.from_jsonable({"GradHist1d": {"hist": empty, "edges": [0.0]}})["GradHist1d"]["hist"] is empty
    with pytest.raises(ValueError, match="field 'GradHist1d.hist': expected an array of numbers"):
        log.from_jsonable({"GradHist1d": {"hist": np.array([1], dtype=object), "edges": [0.0, 1.0]}})


def test_an_array_shape_is_a_list_of_at_most_32_non_negative_integers():
    """A json_tricks array's ``"shape"``: an empty axis and 32 axes are read; a shape that is no list, a negative,
    fractional or boolean length and 33 axes are refused naming the rule."""
    def decoded(data, shape):
        return log.from_jsonable({"Custom": {"__ndarray__": data, "dtype": "float64", "shape": shape}})["Custom"]

    assert decoded([], [0]).shape == (0,) and decoded([1.0], [1] * 32).shape == (1,) * 32
    for shape in (3, [-1], [1.5], [True], [1] * 33):
        with pytest.raises(ValueError, match="field 'Custom': array shape must be a list of at most 32 non-negative"):
            decoded([1.0], shape)


def test_an_encoded_array_marked_fortran_ordered_is_read_in_fortran_order():
    """A ``b64:`` payload is the array's memory: ``"Corder": false`` reads it column by column, true (and no
    ``"Corder"``: the default) row by row. The bytes of 0, 3, 1, 4, 2, 5 are [[0, 1, 2], [3, 4, 5]] in Fortran order."""
    payload = "b64:" + base64.b64encode(struct.pack("<6d", 0, 3, 1, 4, 2, 5)).decode()
    tagged = {"__ndarray__": payload, "dtype": "float64", "shape": [2, 3], "endian": "little"}
    for order, rows in (({"Corder": False}, [[0, 1, 2], [3, 4, 5]]), ({"Corder": True}, [[0, 3, 1], [4, 2, 5]]),
                        ({}, [[0, 3, 1], [4, 2, 5]])):
        assert log.from_jsonable({"Custom": {**tagged, **order}})["Custom"].tolist() == rows


def _gzip_with_comment(data, length):
    """``data`` gzipped, its header holding a comment of ``length`` bytes (the FCOMMENT field, RFC 1952)."""
    compressor = zlib.compressobj(wbits=31)
    member = compressor.compress(data) + compressor.flush()
    header = bytearray(member[:10])
    header[3] |= 0x10  # FLG.FCOMMENT: a zero-terminated comment follows the 10-byte header
    return bytes(header) + b"c" * length + b"\0" + member[10:]


def test_an_encoded_payload_may_be_twice_the_array_limit_plus_1024_characters():
    """Under ``max_array_bytes=16`` two float64 (16 bytes) gzipped with a header comment: a payload of 2·16 + 1024 =
    1056 characters is read (790 bytes, a 760-byte comment), one of 1060 (a 763-byte comment) is refused naming the
    limit before it is decoded, and so is one of 1057 (which, decoded, would be no base64)."""
    def read(comment):
        payload = base64.b64encode(_gzip_with_comment(struct.pack("<2d", 1.5, -2.0), comment)).decode()
        tagged = {"__ndarray__": "b64.gz:" + payload, "dtype": "float64", "shape": [2], "endian": "little"}
        return len(payload), log.from_jsonable({"Custom": tagged}, limits={"max_array_bytes": 16})["Custom"]

    length, value = read(760)
    assert length == 1056 and value.tolist() == [1.5, -2.0]
    with pytest.raises(ValueError, match="encoded array of 1,060 characters, more than twice the limit max_array_bytes"):
        read(763)
    tagged = {"__ndarray__": "b64.gz:" + "A" * 1057, "dtype": "float64", "shape": [2]}
    with pytest.raises(ValueError, match="encoded array of 1,057 characters, more than twice the limit max_array_bytes"):
        log.from_jsonable({"Custom": tagged}, limits={"max_array_bytes": 16})


def test_an_encoded_payload_with_a_character_outside_base64_is_refused():
    """Also a colon: the encoding is the text before the first one (``b64``), the rest is the payload."""
    payload = base64.b64encode(struct.pack("<d", 1.0)).decode()
    assert log.from_jsonable({"Custom": {"__ndarray__": "b64:" + payload, "shape": [1]}})["Custom"].tolist() == [1.0]
    for character in "*:":
        with pytest.raises(ValueError, match="array data is not valid base64"):
            log.from_jsonable({"Custom": {"__ndarray__": "b64:" + payload[:4] + character + payload[4:], "shape": [1]}})


def test_an_encoded_payload_of_too_few_bytes_is_refused_naming_its_count():
    payload = base64.b64encode(struct.pack("<d", 1.0)).decode()
    with pytest.raises(ValueError, match=re.escape("array data holds 8 bytes, its shape [2] and dtype float64 need 16")):
        log.from_jsonable({"Custom": {"__ndarray__": "b64:" + payload, "shape": [2]}})


def test_an_encoded_payload_is_inflated_one_byte_beyond_its_shape_at_most():
    """A gzip member whose deflate data, after 16 + 1 bytes, copies from before its start (a preset dictionary it
    lacks: corrupt): under shape [2] float64 (16 bytes) it is refused as holding more than 16 bytes, the corrupt
    part never inflated."""
    dictionary = b"a preset dictionary the member lacks"
    compressor = zlib.compressobj(level=9, wbits=-15, zdict=dictionary)
    deflated = compressor.compress(bytes(range(16)) + dictionary) + compressor.flush()
    member = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + deflated + bytes(8)  # gzip header, no name, no CRC
    with pytest.raises(zlib.error, match="invalid distance too far back"):
        zlib.decompress(member, wbits=31)
    tagged = {"__ndarray__": "b64.gz:" + base64.b64encode(member).decode(), "dtype": "float64", "shape": [2]}
    with pytest.raises(ValueError, match=re.escape("array data holds more than 16 bytes, its shape [2]")):
        log.from_jsonable({"Custom": tagged})


def test_the_endian_tag_sets_the_byte_order_over_the_dtypes_own():
    """A hand-made tag ``"dtype": ">f8"`` (big-endian) with ``"endian": "little"``: the bytes of 1.5 packed
    little-endian read as 1.5."""
    payload = base64.b64encode(struct.pack("<d", 1.5)).decode()
    tagged = {"__ndarray__": "b64:" + payload, "dtype": ">f8", "shape": [1], "endian": "little"}
    assert log.from_jsonable({"Custom": tagged})["Custom"].tolist() == [1.5]


def test_a_listed_array_takes_its_tagged_dtype_and_shape_within_the_size_limit():
    """A list tagged float32 is float32 (not the float64 numpy infers), a flat list of four with shape [2, 2] is
    2 × 2; under ``max_array_bytes=16`` two float64 (16 bytes) are read and three refused naming the limit."""
    value = log.from_jsonable({"Custom": {"__ndarray__": [1, 2, 3, 4], "dtype": "float32", "shape": [2, 2]}})["Custom"]
    assert value.dtype == np.float32 and value.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert log.from_jsonable({"Custom": {"__ndarray__": [1.0, 2.0]}}, limits={"max_array_bytes": 16})["Custom"].size == 2
    with pytest.raises(ValueError, match="array of 24 bytes, more than the limit max_array_bytes=16"):
        log.from_jsonable({"Custom": {"__ndarray__": [1.0, 2.0, 3.0]}}, limits={"max_array_bytes": 16})


def test_check_header_takes_a_header_without_a_version_and_shows_what_it_refuses():
    log.check_header({"format": "cockpit-lite"})  # version 1 by default
    log.check_header({"format": "cockpit-lite", "params": [{"name": "w", "shape": [0, 3]}, {"name": "s", "shape": []}]})
    with pytest.raises(ValueError, match=re.escape("expected 'cockpit-lite' (not a cockpit-lite log), got \"other\"")):
        log.check_header({"format": "other", "version": 1})
    with pytest.raises(ValueError, match=re.escape('expected an integer, got "1"')):
        log.check_header({"format": "cockpit-lite", "version": "1"})


def test_check_entry_takes_every_kind_of_value_a_record_holds():
    """A hand-made step with a value of every checked kind, nulls where allowed, and a custom key."""
    finding = {"kind": "dead_relu", "severity": "warning", "message": "m", "step": 0, "layer": None,
               "suggestion": "s", "evidence": None}
    log.check_entry({
        "Loss": 1.0, "Alpha": None, "GradNorm": [0.1, None], "HessTrace": np.array([1.0]),
        "GradHist1d": {"hist": np.array([1, 2]), "edges": np.array([0.0, 1.0, 2.0])}, "flags": ["nonfinite_loss"],
        "findings": [finding], "layers": {"NormTest": [0.1, None], "GradHist1d": [{"hist": [1]}, [1.0]]},
        "meta": {"NormTest": {"se": 0.1}}, "budget": {"version": 2}, "batch": {"size": 8, "accumulated": False},
        "ActivationStats": {"fc1": {"dead": 0.5, "kind": "relu", "saturated": None}},
        "InputStats": {"mean": 0.1, "std": None}, "Custom": {"any": ["json", 1, None]}})


def test_check_entry_raises_a_value_error_saying_what_is_wrong():
    """Hand-made steps: epoch-level values (``Cockpit.log``) may be numbers, null or lists of them."""
    log.check_entry({"epoch_count": 3, "train_loss": 0.5, "learning_rate": [0.1, None], "valid_loss": None})
    for entry, message in [({"Loss": "a"}, 'expected a number or null, got "a"'),
                           ({"train_loss": "a"}, 'expected a number, null or a list of numbers, got "a"'),
                           (5, "expected a step record (a JSON object), got 5")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            log.check_entry(entry)


def test_check_entry_shows_a_refused_value_in_60_characters_of_json():
    """A refused value is shown as its JSON cut to 60 characters (a string of 100 x: its quote and 59 x), with what
    JSON cannot hold as text (edges left an array inside a histogram), and an array on its own as "an array"."""
    for entry, message in [({"Loss": "x" * 100}, 'expected a number or null, got "' + "x" * 59),
                           ({"GradHist1d": {"hist": [1, 2], "edges": np.array([0.0, 1.0, 2.0])}},
                            "expected a histogram {'hist': [...], 'edges': [...]}, got "
                            '{"hist": [1, 2], "edges": "[0. 1. 2.]"}'),
                           ({"Loss": np.array([1.0])}, "expected a number or null, got an array")]:
        with pytest.raises(ValueError, match=re.escape(message) + "$"):
            log.check_entry(entry)


def test_check_entry_names_the_field_it_is_given():
    """``field``: where the step is; the error's ``field`` starts with it, for a step that is no object and for one
    of its values."""
    for entry, field in [(5, ("run", 3)), ({"Loss": "a"}, ("run", 3, "Loss"))]:
        with pytest.raises(ValueError) as raised:
            log.check_entry(entry, field=("run", 3))
        assert raised.value.field == field


def test_check_entry_takes_integers_below_2_to_the_1023():
    """An integer is a number if its magnitude is below 2**1023, the bound excluded: 2**1023 - 1 and its negative
    are taken (as a scalar and as a per-parameter item), 2**1023 and its negative refused."""
    for value in (2**1023 - 1, -(2**1023 - 1)):
        log.check_entry({"Loss": value, "GradNorm": [value]})
    for value in (2**1023, -2**1023):
        with pytest.raises(ValueError, match=re.escape(f"expected a number or null, got {str(value)[:60]}")):
            log.check_entry({"Loss": value})


@pytest.mark.parametrize("endian", ["big", "little"])
def test_an_encoded_array_is_read_in_the_byte_order_its_tag_names(endian):
    """json_tricks' ``b64:`` array with ``"endian"``: float32 1.5, −2, 0.25, 3 packed by hand (``struct``) in that
    byte order decode to those values, whatever the machine's order."""
    raw = struct.pack((">" if endian == "big" else "<") + "4f", 1.5, -2.0, 0.25, 3.0)
    tagged = {"__ndarray__": "b64:" + base64.b64encode(raw).decode(), "dtype": "float32", "shape": [2, 2],
              "Corder": True, "endian": endian}
    value = log.from_jsonable({"Custom": [tagged]})["Custom"][0]
    assert value.dtype.kind == "f" and value.dtype.itemsize == 4
    np.testing.assert_array_equal(value, [[1.5, -2.0], [0.25, 3.0]])


def test_a_blank_line_between_lines_is_skipped(tmp_path):
    path = tmp_path / "run.jsonl"
    write_sample(path)
    lines = path.read_text().split("\n")
    path.write_text("\n".join(lines[:2] + ["", "  "] + lines[2:]))
    assert sorted(log.read(path)) == [0, 1] and log.read(path)[1]["Loss"] == 1.25


def test_is_finite_number():
    assert [log.is_finite_number(v) for v in (1, -2.5, np.float32(3.0), np.int64(7))] == [True] * 4
    assert [log.is_finite_number(v) for v in (float("inf"), float("nan"), np.float64("-inf"), None, "1.0", [1.0])] == [False] * 6


# ----------------------------------------------------------------------------- run segments


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_second_writer_appends_a_run_segment_and_readers_pick_the_last(tmp_path):
    path = tmp_path / "run.jsonl"
    first = log.JSONLinesWriter(path, {"params": [{"name": "w", "shape": [2]}]})
    for step in range(100):
        first.append(step, {"Loss": 1.0})
    first.close()
    second = log.JSONLinesWriter(path, {"params": [{"name": "v", "shape": [3]}]})
    for step in range(5):
        second.append(step, {"Loss": 2.0})
    second.close()
    headers = [line for line in _lines(path) if "format" in line]
    assert len(headers) == 2 and headers[0]["run"] != headers[1]["run"] == second.run
    assert len(_lines(path)) == 100 + 5 + 2  # nothing lost
    assert "\n\n" not in path.read_text()  # the first log ended whole: no newline was added before the header
    header, record = log.read_jsonl(path)
    assert header["run"] == second.run and sorted(record) == list(range(5)) and record[0]["Loss"] == 2.0
    assert log.read(path) == record
    everything = log.read_jsonl(path, segment="all")
    assert [h["params"][0]["name"] for h, _ in everything] == ["w", "v"]
    assert len(everything[0][1]) == 100 and log.read(path, segment=0)[99]["Loss"] == 1.0
    assert log.read_jsonl(path, segment=first.run)[0]["run"] == first.run
    assert [s["steps"] for s in log.segments(path)] == [100, 5]
    assert len(log.read(path, segment="all")) == 2
    with pytest.raises(ValueError, match="2 run segment"):
        log.read(path, segment=2)


def test_a_run_id_that_heads_two_segments_reads_as_the_last_of_them(tmp_path):
    """Two logs joined by hand (``cat a.jsonl b.jsonl``): segments of runs X, Y, X. A header that
    repeats an earlier id without ``"resumed"`` starts a new segment; ``segment="X"`` is the latest
    of them, as ``-1`` is the latest segment."""
    header = {"format": "cockpit-lite", "version": 1}
    lines = [{**header, "run": "X", "quantities": ["first"]}, {"step": 0, "Loss": 1.0}, {"step": 1, "Loss": 1.5},
             {**header, "run": "Y"}, {"step": 0, "Loss": 2.0},
             {**header, "run": "X", "quantities": ["again"]}, {"step": 0, "Loss": 3.0}]
    path = tmp_path / "joined.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [(s["run"], s["steps"]) for s in log.segments(path)] == [("X", 2), ("Y", 1), ("X", 1)]
    assert log.read(path, segment="X") == {0: {"Loss": 3.0}}
    assert log.read_jsonl(path, segment="X")[0]["quantities"] == ["again"]
    assert log.read_segment(path, "X")[1:] == ({0: {"Loss": 3.0}}, 3)
    assert log.read(path, segment="Y") == {0: {"Loss": 2.0}}
    assert log.read(path, segment=0) == {0: {"Loss": 1.0}, 1: {"Loss": 1.5}}  # the first X: by its index
    unknown = f"{path}: no run segment with run id 'Z' (the runs: ['X', 'Y', 'X'])"
    with pytest.raises(ValueError, match=re.escape(unknown)):
        log.read(path, segment="Z")


def test_all_segments_are_read_under_the_limits_given_and_a_torn_line_names_the_file(tmp_path):
    path = tmp_path / "run.jsonl"
    write_sample(path)
    with pytest.raises(log.RecordError, match="line 1: line longer than the limit max_line_bytes=50"):
        log.read_jsonl(path, segment="all", limits={"max_line_bytes": 50})
    text = path.read_text()
    path.write_text(text[: len(text) - 7])
    with pytest.warns(UserWarning, match=re.escape(f"{path}: last line (5) of a run segment is incomplete")):
        assert len(log.read_jsonl(path, segment="all")) == 1


def test_an_empty_log_reads_as_one_empty_segment_at_index_0_and_minus_1_only(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    assert log.read(path) == {} and log.read(path, segment=0) == {} and log.read_segment(path, -1) == ({}, {}, 0)
    for segment in (1, -2):
        with pytest.raises(ValueError, match=f"the log is empty; segment={segment} does not exist"):
            log.read(path, segment=segment)


def test_read_segment_refuses_all_and_names_the_reader_that_takes_it(tmp_path):
    path = tmp_path / "run.jsonl"
    write_sample(path)
    with pytest.raises(ValueError, match=re.escape("use read_jsonl(path, segment='all')")):
        log.read_segment(path, "all")
    everything = log.read_jsonl(path, segment="all")  # the named fix
    assert len(everything) == 1 and sorted(everything[0][1]) == [0, 1]


def test_a_header_repeating_the_previous_run_id_continues_its_segment_and_a_resumed_one_may_start_a_log(tmp_path):
    """Hand-made logs: a header that repeats the run id of the segment before it, without ``"resumed"``, continues
    that segment; a log whose first header is marked ``"resumed"`` (a run resumed into a new file) is one segment."""
    header = {"format": "cockpit-lite", "version": 1}
    path = tmp_path / "repeated.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in [
        {**header, "run": "X"}, {"step": 0, "Loss": 1.0}, {**header, "run": "X"}, {"step": 1, "Loss": 0.5}]))
    assert [(s["run"], s["steps"]) for s in log.segments(path)] == [("X", 2)]
    path = tmp_path / "resumed.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in [
        {**header, "run": "X", "resumed": True, "resumed_after": 4}, {"step": 5, "Loss": 1.0}]))
    assert [(s["run"], s["steps"]) for s in log.segments(path)] == [("X", 1)] and log.read(path) == {5: {"Loss": 1.0}}


def test_a_log_holding_only_a_torn_header_is_refused_naming_its_line(tmp_path):
    """A run that died writing its header left one incomplete line and nothing else: there is no segment to read."""
    path = tmp_path / "run.jsonl"
    path.write_text('{"format": "cockpit-lite", "vers')
    with pytest.raises(log.RecordError, match=re.escape(f"{path}, line 1: not valid JSON")):
        log.read(path)


def test_a_step_line_with_a_format_key_is_a_step(tmp_path):
    """A line with ``"step"`` is a step even when it holds a key ``"format"`` (a custom quantity's), not a header."""
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps({"format": "cockpit-lite", "version": 1, "run": "X"}) + "\n"
                    + json.dumps({"step": 0, "format": "mine", "Loss": 1.0}) + "\n")
    assert log.read(path) == {0: {"format": "mine", "Loss": 1.0}} and len(log.segments(path)) == 1


def test_the_line_limit_counts_a_lines_bytes_without_its_newline(tmp_path):
    """``max_line_bytes`` = L: a step line of L bytes is read, ended by its newline or last in the file without one;
    under L − 1 it is refused either way, naming the line and the limit."""
    header = json.dumps({"format": "cockpit-lite", "version": 1})
    step = json.dumps({"step": 0, "Loss": 1.0}).ljust(len(header) + 10)  # JSON allows the trailing blanks
    path = tmp_path / "run.jsonl"
    for end in ("\n", ""):
        path.write_text(header + "\n" + step + end)
        assert log.read(path, limits={"max_line_bytes": len(step)}) == {0: {"Loss": 1.0}}
        with pytest.raises(log.RecordError, match=f"line 2: line longer than the limit max_line_bytes={len(step) - 1}"):
            log.read(path, limits={"max_line_bytes": len(step) - 1})


def test_a_resumed_run_continues_its_segment(tmp_path):
    path = tmp_path / "run.jsonl"
    first = log.JSONLinesWriter(path, {})
    first.append(0, {"Loss": 1.0})
    first.close()
    resumed = log.JSONLinesWriter(path, {}, run=first.run)
    resumed.append(1, {"Loss": 0.5})
    resumed.close()
    header, record = log.read_jsonl(path)
    assert sorted(record) == [0, 1] and header["run"] == first.run and header["resumed"] is True
    assert len(log.segments(path)) == 1


def test_a_resumed_run_replaces_what_its_segment_held_after_the_checkpoint(tmp_path):
    path = tmp_path / "run.jsonl"
    first = log.JSONLinesWriter(path, {})
    for step in range(5):  # checkpointed after step 2, went on to step 4, died
        first.append(step, {"Loss": float(step)})
    first.close()
    other = log.JSONLinesWriter(path, {})  # another run on the same path meanwhile
    other.append(0, {"Loss": 9.0})
    other.close()
    resumed = log.JSONLinesWriter(path, {})
    resumed.resume(first.run, 2)
    assert resumed.run == first.run
    resumed.append(3, {"Loss": 0.5})
    resumed.close()
    with pytest.raises(ValueError, match="before its first step"):
        resumed.resume(first.run, 2)
    assert log.read(path, segment=first.run) == {0: {"Loss": 0.0}, 1: {"Loss": 1.0}, 2: {"Loss": 2.0}, 3: {"Loss": 0.5}}
    assert [s["run"] for s in log.segments(path)] == [first.run, other.run]
    assert log.read_jsonl(path, segment=first.run)[0]["resumed_after"] == 2


def test_the_header_is_written_with_the_first_line(tmp_path):
    path = tmp_path / "run.jsonl"
    writer = log.JSONLinesWriter(path, {})
    assert path.read_text() == ""
    writer.close()  # a run without steps is its header
    assert [line["run"] for line in _lines(path)] == [writer.run]


def test_each_line_is_on_disk_when_append_returns(tmp_path):
    """In a folder made for the log; the header (a new run: not marked resumed, its UTC start
    time) and each step's line are in the file as soon as ``append`` returns."""
    path = tmp_path / "new folder" / "run.jsonl"
    writer = log.JSONLinesWriter(path, {})
    writer.append(0, {"Loss": 1.0})
    header, line = _lines(path)
    assert line == {"step": 0, "Loss": 1.0} and header["run"] == writer.run and "resumed" not in header
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", header["started"]), header["started"]
    writer.append(1, {"Loss": 0.5})
    assert len(_lines(path)) == 3
    writer.close()


def test_a_torn_line_before_a_new_segment_is_skipped(tmp_path):
    path = tmp_path / "run.jsonl"
    write_sample(path)
    text = path.read_text()
    path.write_text(text[: len(text) - 7])  # the run crashed while writing its last line
    writer = log.JSONLinesWriter(path, {})  # ... and was restarted on the same log
    writer.append(0, {"Loss": 3.0})
    writer.close()
    assert log.read(path) == {0: {"Loss": 3.0}}
    with pytest.warns(UserWarning, match=re.escape(f"{path}: last line (5) of a run segment is incomplete")):
        old = log.read(path, segment=0)
    assert old[1].keys() == {"GradHist2d"}


@pytest.mark.parametrize("text", ["my notes\n", '{\n  "step": 0\n}\n', "\nmy notes\n"],
                         ids=["notes", "pretty_printed_json", "blank_first_line"])
def test_a_file_that_is_no_log_is_not_written_into(tmp_path, text):
    path = tmp_path / "notes.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match="not a cockpit-lite log.*another log path"):
        log.JSONLinesWriter(path, {})
    assert path.read_text() == text


def test_an_empty_file_takes_the_header_as_its_first_line(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"")  # made by another tool, or a run that never wrote
    writer = log.JSONLinesWriter(path, {})
    writer.append(0, {"Loss": 1.0})
    writer.close()
    assert path.read_text().startswith('{"format": "cockpit-lite"') and log.read(path) == {0: {"Loss": 1.0}}


def _fsync_failing(errno_value):
    def fsync(fd):
        raise OSError(errno_value, os.strerror(errno_value))

    return fsync


def test_fsync_refused_by_a_special_file_is_no_failure_and_any_other_warns_or_raises(tmp_path, monkeypatch):
    """EINVAL/ENOTSUP (a pipe, a special file: nothing to sync) passes silently; EIO warns naming
    it and is kept in ``errors`` (``strict=True``: raises it)."""
    for errno_value in (errno.EINVAL, errno.ENOTSUP):
        monkeypatch.setattr(os, "fsync", _fsync_failing(errno_value))
        writer = log.JSONLinesWriter(tmp_path / f"{errno_value}.jsonl", {})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            writer.close()
        assert writer.errors == []
    monkeypatch.setattr(os, "fsync", _fsync_failing(errno.EIO))
    writer = log.JSONLinesWriter(tmp_path / "eio.jsonl", {})
    with pytest.warns(RuntimeWarning, match=os.strerror(errno.EIO)):
        writer.close()
    assert [e.errno for e in writer.errors] == [errno.EIO]
    strict = log.JSONLinesWriter(tmp_path / "strict.jsonl", {}, strict=True)
    with pytest.raises(OSError, match="strict.jsonl") as raised:
        strict.close()
    assert raised.value.errno == errno.EIO


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="needs time.tzset to change the time zone")
def test_a_run_id_and_the_start_time_are_utc(tmp_path, monkeypatch):
    """The run id: UTC time of day and 6 random hex digits; the header's "started": UTC too."""
    monkeypatch.setenv("TZ", "IST-5:30")  # 5 h 30 min east of UTC: local time is not UTC
    time.tzset()
    try:
        before = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        run = log.new_run_id()
        writer = log.JSONLinesWriter(tmp_path / "run.jsonl", {})
        after = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        writer.close()
    finally:
        monkeypatch.undo()
        time.tzset()
    assert re.fullmatch(r"\d{8}T\d{6}-[0-9a-f]{6}", run) and run[:15] in (before, after), (run, before, after)
    started = _lines(tmp_path / "run.jsonl")[0]["started"]
    assert started.replace("-", "").replace(":", "")[:15] in (before, after), (started, before, after)


def test_close_fsyncs(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    writer = log.JSONLinesWriter(tmp_path / "run.jsonl", {})
    writer.append(0, {"Loss": 1.0})
    writer.close()
    assert len(synced) == 1
    with pytest.raises(ValueError, match="closed"):
        writer.append(1, {"Loss": 1.0})


# ----------------------------------------------------------------------------- a full disk


class FullDisk:
    """A file whose writes fail with ENOSPC while ``full`` (after taking ``partial`` bytes once)."""

    def __init__(self, file):
        self.file, self.full, self.partial, self.calls = file, False, 0, 0

    def write(self, data):
        self.calls += 1
        if self.full:
            if self.partial:
                n, self.partial = self.partial, 0
                return self.file.write(data[:n])
            raise OSError(28, "No space left on device")
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)


def test_a_full_disk_warns_once_keeps_the_lines_and_catches_up_in_order(tmp_path):
    path = tmp_path / "run.jsonl"
    writer = log.JSONLinesWriter(path, {})
    disk = writer._file = FullDisk(writer._file)
    writer.append(0, {"Loss": 0.0})
    disk.full, disk.partial = True, 5  # the disk fills in the middle of a line
    with pytest.warns(RuntimeWarning, match=r"run.jsonl \(\[Errno 28\] No space left on device\)") as caught:
        for step in range(1, 6):
            writer.append(step, {"Loss": float(step)})
    assert len(caught) == 1 and writer.pending == 5 and [e.errno for e in writer.errors] == [28] * 5
    disk.full = False  # space freed
    writer.append(6, {"Loss": 6.0})
    writer.close()
    assert writer.pending == 0
    assert [line.get("step") for line in _lines(path)] == [None, 0, 1, 2, 3, 4, 5, 6]
    assert log.read(path) == {s: {"Loss": float(s)} for s in range(7)}


def test_a_full_disk_at_close_warns_and_does_not_raise(tmp_path, monkeypatch):
    """The step's line and close's retry of it both fail: one warning, both failures kept, the line pending, and
    no ``fsync`` (the file does not hold the line: there is nothing complete to sync)."""
    synced = []
    monkeypatch.setattr(os, "fsync", synced.append)
    writer = log.JSONLinesWriter(tmp_path / "run.jsonl", {})
    disk = writer._file = FullDisk(writer._file)
    disk.full = True
    with pytest.warns(RuntimeWarning, match="No space left") as caught:
        writer.append(0, {"Loss": 1.0})
        writer.close()
    assert len(caught) == 1 and writer.closed and writer.pending == 1
    assert [e.errno for e in writer.errors] == [28, 28] and synced == []


class FailingClose:
    """A file whose ``close`` fails with EIO (a network file system reports a failed write-back at close)."""

    def __init__(self, file):
        self.file = file

    def close(self):
        self.file.close()
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def __getattr__(self, name):
        return getattr(self.file, name)


def test_a_failing_close_is_kept_in_errors_and_does_not_raise(tmp_path):
    path = tmp_path / "run.jsonl"
    writer = log.JSONLinesWriter(path, {})
    writer._file = FailingClose(writer._file)
    writer.append(0, {"Loss": 1.0})
    writer.close()
    assert writer.closed and [e.errno for e in writer.errors] == [errno.EIO]
    assert log.read(path) == {0: {"Loss": 1.0}}


def test_strict_raises_on_a_full_disk_and_keeps_the_line(tmp_path):
    path = tmp_path / "run.jsonl"
    writer = log.JSONLinesWriter(path, {}, strict=True)
    disk = writer._file = FullDisk(writer._file)
    disk.full = True
    with pytest.raises(OSError, match="run.jsonl.*No space left") as raised:
        writer.append(0, {"Loss": 1.0})
    assert raised.value.errno == 28 and writer.pending == 1
    disk.full = False
    writer.close()
    assert log.read(path) == {0: {"Loss": 1.0}}


def test_a_full_disk_never_stops_a_cockpit(tmp_path):
    import torch

    from cockpit_lite import Cockpit
    from cockpit_lite.quantities import GradNorm, Loss

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    path = tmp_path / "run.jsonl"
    cp = Cockpit(model, quantities=[Loss(), GradNorm()], log=path, diagnose=False)
    disk = cp._writer._file = FullDisk(cp._writer._file)
    disk.full = True
    with pytest.warns(RuntimeWarning, match="No space left") as caught:
        for step in range(3):
            loss = model(torch.randn(4, 3)).square().mean()
            with cp(step, info={"loss": loss, "batch_size": 4}):
                loss.backward()
            model.zero_grad()
        disk.full = False
        cp.close()
    assert len([w for w in caught if "No space left" in str(w.message)]) == 1
    assert sorted(log.read(path)) == [0, 1, 2] == sorted(cp.get_output())


def test_a_log_whose_header_was_torn_is_appended_to(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text('{"format": "cockpit')  # the first run died (or the disk was full) while writing its header
    writer = log.JSONLinesWriter(path, {})
    writer.append(0, {"Loss": 1.0})
    writer.close()
    with pytest.warns(UserWarning, match="incomplete"):
        assert log.read(path, segment="all") == [{0: {"Loss": 1.0}}]


def test_a_json_file_that_is_no_utf8_or_beyond_the_size_limit_is_refused_naming_it(tmp_path):
    path = tmp_path / "r.json"
    path.write_bytes(b'{"0": {"Loss": 1.0, "Note": "\xff"}}')
    with pytest.raises(log.RecordError, match=r"r\.json: not valid JSON"):
        log.read(path)
    log.write_json(path, {0: {"Loss": 1.0}})
    size = path.stat().st_size
    assert log.read(path, limits={"max_file_bytes": size}) == {0: {"Loss": 1.0}}
    with pytest.raises(log.RecordError, match="max_file_bytes"):
        log.read(path, limits={"max_file_bytes": size - 1})


def test_a_fortran_ordered_array_of_a_json_file_reads_as_json_tricks_wrote_it(tmp_path):
    """json_tricks (the original Cockpit's ``write``) lists every array in its logical order
    (``tolist()``) and marks a Fortran-ordered one ``"Corder": false``, which only describes
    its memory; this is the text json_tricks 3.17 writes for ``np.asfortranarray(arange(6).reshape(2, 3))``."""
    path = tmp_path / "cockpit.json"
    path.write_text('{"0": {"GradHist1d": {"hist": {"__ndarray__": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], '
                    '"dtype": "float64", "shape": [2, 3], "Corder": false}, "edges": {"__ndarray__": '
                    '[0.0, 1.0, 2.0, 3.0], "dtype": "float64", "shape": [4]}}}}')
    assert log.read(path)[0]["GradHist1d"]["hist"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
