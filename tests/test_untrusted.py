"""mpidp.untrusted, the one reader: every input gives the value checked or one InputError line,
never another exception (random and mutated values, by Hypothesis), and files that would
hang, exhaust memory or blow the stack are refused before they are parsed."""

from __future__ import annotations

import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mpidp import untrusted as u
from mpidp.untrusted import InputError

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=20)
    | st.floats(allow_nan=True, allow_infinity=True),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=5),
    max_leaves=30)

CALL = u.Record({"seq": u.Int(0, 2**40), "name": u.Text(32, ("allreduce", "bcast")),
                 "count": u.Int(0, 2**40), "done": u.Bool(), "t": u.Num(0),
                 "peers": u.List(u.Int(0, 1023), max_len=8),
                 "note": u.Optional(u.Text(64))}, optional=frozenset({"note"}))
RECORD = u.Record({"rank": u.Int(0, 1023), "calls": u.List(CALL, max_len=16),
                   "extra": u.Any()})
VALID = {"rank": 3, "calls": [{"seq": 1, "name": "bcast", "count": 8, "done": False,
                               "t": 0.5, "peers": [0, 1]}], "extra": {"x": [1]}}
SCHEMAS = [u.Int(0, 10), u.Num(-1, 1), u.Num(finite=False), u.Text(5), u.Bool(), u.Null(),
           u.Any(), u.List(u.Int()), u.Either((u.Int(), u.Text())), u.Optional(u.Bool()),
           CALL, RECORD]


def _valid(value, schema) -> bool:
    """What the schema promises of a value it returns (an independent restatement)."""
    if isinstance(schema, u.Int):
        return type(value) is int and schema.lo <= value <= schema.hi
    if isinstance(schema, u.Num):
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and (not schema.finite or math.isfinite(value))
                and (math.isnan(value) or schema.lo <= value <= schema.hi))
    if isinstance(schema, u.Text):
        return (isinstance(value, str) and len(value) <= schema.max_len
                and (schema.choices is None or value in schema.choices))
    if isinstance(schema, u.Bool):
        return isinstance(value, bool)
    if isinstance(schema, u.Null):
        return value is None
    if isinstance(schema, u.List):
        return isinstance(value, list) and all(_valid(v, schema.of) for v in value)
    if isinstance(schema, u.Either):
        return any(_valid(value, o) for o in schema.options)
    if isinstance(schema, u.Record):
        return isinstance(value, dict) and all(
            _valid(value[k], s) if k in value else k in schema.optional
            for k, s in schema.fields.items())
    return True


@settings(max_examples=300, deadline=None)
@given(value=JSON, schema=st.sampled_from(SCHEMAS))
def test_a_random_value_is_checked_or_refused_in_one_line(value, schema):
    try:
        out = u.check(value, schema, "f.json: x")
    except InputError as e:
        assert str(e).startswith("f.json: x") and "\n" not in str(e)
    else:
        assert _valid(out, schema), out


NUMS = st.integers(-3, 3) | st.floats(-3, 3) | st.floats(allow_nan=True, allow_infinity=True)


@settings(max_examples=200, deadline=None)
@given(value=NUMS, schema=st.sampled_from([u.Num(-1, 1), u.Num(0), u.Num(finite=False),
                                           u.Int(-1, 1)]))
def test_a_number_is_checked_against_its_bounds(value, schema):
    """Numbers near and beyond the bounds, so the oracle's range check is exercised."""
    try:
        out = u.check(value, schema, "n")
    except InputError as e:
        assert str(e).startswith("n: ") and "\n" not in str(e)
    else:
        assert _valid(out, schema), out


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_mutated_valid_record_is_checked_or_refused_naming_the_field(data):
    value = json.loads(json.dumps(VALID))
    paths = list(_paths(value))[1:]
    path = data.draw(st.sampled_from(paths))
    *parent_path, last = path
    parent = value
    for k in parent_path:
        parent = parent[k]
    if data.draw(st.booleans()):
        parent[last] = data.draw(JSON)  # a field replaced by anything
    else:
        del parent[last]  # a field or an item gone
    try:
        out = u.check(value, RECORD, "r.json")
    except InputError as e:
        assert str(e).startswith("r.json") and "\n" not in str(e)
    else:
        assert _valid(out, RECORD)


def test_bounds_and_the_types_that_pass_for_numbers():
    assert u.check(7, u.Int(0, 10)) == 7
    for bad, says in ((11, "out of range"), (True, "not a whole number"),
                      (7.0, "not a whole number"), ("7", "not a whole number")):
        with pytest.raises(InputError, match=says):
            u.check(bad, u.Int(0, 10), "n")
    with pytest.raises(InputError, match="not a finite number"):
        u.check(math.inf, u.Num())
    with pytest.raises(InputError, match="no field 'rank'"):
        u.check({}, RECORD, "r")
    with pytest.raises(InputError, match="a list of 17 items"):
        u.check([VALID["calls"][0]] * 17, u.List(CALL, max_len=16))
    with pytest.raises(InputError, match=r"calls\[0\]\.name: 'scan' is not one of"):
        u.check({**VALID, "calls": [{**VALID["calls"][0], "name": "scan"}]}, RECORD, "r")


@pytest.mark.parametrize("v", [2.9, "3", True, None])
def test_index_refuses_what_int_would_truncate_or_convert(v):
    with pytest.raises(TypeError, match="addends must be a whole number"):
        u.index(v, "addends")
    assert u.index(3, "addends") == 3


# ---------------------------------------------------------------- files


def test_read_json_reads_a_regular_file(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps(VALID))
    assert u.read_json(str(tmp_path / "r.json"), 1 << 16) == VALID


def test_a_fifo_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "r.json")  # no writer: a blocking open would wait forever
    with pytest.raises(InputError, match="not a regular file"):
        u.read_json(str(tmp_path / "r.json"), 1 << 16)


def test_an_oversize_file_is_refused_before_it_is_read(tmp_path):
    (tmp_path / "r.json").write_text("[" + "0," * 1000 + "0]")
    with pytest.raises(InputError, match="more than the 100 "):
        u.read_json(str(tmp_path / "r.json"), 100)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 5000 + "1" + "}" * 5000])
def test_deep_nesting_is_refused_before_json_recurses(tmp_path, text):
    (tmp_path / "r.json").write_text(text)
    with pytest.raises(InputError, match="nested more than"):
        u.read_json(str(tmp_path / "r.json"), 1 << 20)
    with pytest.raises(InputError, match="nested more than"):
        u.parse_json(text, "settings")


def test_brackets_inside_strings_are_not_nesting():
    text = json.dumps({"s": "[" * 1000 + '\\"{'})
    assert u.parse_json(text, "s") == {"s": "[" * 1000 + '\\"{'}


def test_a_final_symlink_is_not_followed(tmp_path):
    (tmp_path / "real.json").write_text("1")
    os.symlink("real.json", tmp_path / "link.json")
    with pytest.raises(InputError, match="cannot be read"):
        u.read_json(str(tmp_path / "link.json"), 100)


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()))
def test_any_bytes_give_a_value_or_input_error(tmp_path, raw):
    path = tmp_path / "r.json"
    path.write_bytes(raw)
    try:
        u.read_json(str(path), 1 << 16)
    except InputError as e:
        assert "\n" not in str(e)
    try:
        u.parse_json(raw.decode("utf-8", errors="replace"), "entry")
    except InputError as e:
        assert str(e).startswith("entry")


def test_the_package_reads_json_through_the_one_reader_only():
    """Issue 33: `mpidp.untrusted` is the only reader of JSON files in the package (a bare
    `json.load` blocks on a FIFO, recurses on deep nesting and reads any size)."""
    import re

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mpidp")
    found = []
    for folder, _, names in os.walk(root):
        for name in (n for n in names if n.endswith(".py") and n != "untrusted.py"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                found += [f"{name}:{n}" for n, line in enumerate(f, 1)
                          if re.search(r"\bjson\.load\(|np\.load\(|pickle\.load", line)]
    assert found == [], found
