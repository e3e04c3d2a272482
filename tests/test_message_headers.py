"""storage.message: the header edits dead-lettering and delivery counting
make (`header_with`, `expiration`, `has_expiration`), checked against
pamqp's decoder on content headers with any set of properties: the edited
entries change, the expiration goes when asked, everything else decodes as
it did.
"""
from __future__ import annotations

import datetime

from hypothesis import given
from hypothesis import strategies as st

from storage.message import Message, encode_value
from test_message import as_dict, build_header, pamqp_decode, property_sets

edits = st.dictionaries(st.sampled_from(["x-death", "x-delivery-count", "a", "CC"]),
                        st.one_of(st.integers(-5, 5), st.text(max_size=5),
                                  st.lists(st.text(max_size=3), max_size=2)), max_size=3)
removals = st.lists(st.sampled_from(["CC", "a", "x-first-death-queue"]), max_size=2, unique=True)


@given(props=property_sets(), entries=edits, remove=removals, drop=st.booleans())
def test_header_with_edits_only_what_it_is_asked_to(props, entries, remove, drop):
    message = Message("", "k", build_header(props, body_size=3), b"abc")
    header = message.header_with({k: encode_value(v) for k, v in entries.items()}, tuple(remove), drop)
    before = as_dict(pamqp_decode(message.header).properties)
    after = as_dict(pamqp_decode(header).properties)
    expected_headers = {k: v for k, v in (before["headers"] or {}).items() if k not in remove}
    expected_headers.update(entries)
    assert after.pop("headers") == expected_headers
    assert after.pop("expiration") == (None if drop else before["expiration"])
    del before["headers"], before["expiration"]
    assert after == before
    assert message.header == build_header(props, body_size=3)  # the shared message is untouched


@given(props=property_sets())
def test_expiration_is_read_from_the_wire_bytes(props):
    message = Message("", "k", build_header(props), b"")
    expected = props.get("expiration")
    assert message.has_expiration == (expected is not None)
    if expected is not None and expected.isdigit():
        assert message.expiration == int(expected)


def test_timestamps_and_longs_are_encoded_as_rabbitmq_writes_them():
    when = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    assert encode_value(when) == b"T" + (1704164645).to_bytes(8, "big")
    assert encode_value(1) == b"l" + (1).to_bytes(8, "big")
    assert encode_value(["a"]) == b"A\x00\x00\x00\x06S\x00\x00\x00\x01a"
