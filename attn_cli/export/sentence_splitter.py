"""A rule-based sentence splitter in the form Argos Translate reads: a MiniSBD model (ONNX).

Argos Translate splits each paragraph into sentences before translating them, with a MiniSBD
model: the one in the package's minisbd/ directory, else one it downloads on first use. attn's
packages carry this one, so that they translate with no network. It ends a sentence after 。！？
(and their half-width forms), and after . ! ? … followed by a space or the end of the paragraph,
"3.5" and "e.g.x" staying whole; like any such rule it also ends one after "Mr.".

MiniSBD gives its model the paragraph's characters as ids of its vocabulary (`units`) and takes
the class of each character (0 inside a token, 1 end of a token, 2 end of a sentence) as the argmax
of the model's output. This model's output is two table lookups added: one row for the character,
one for the character after it (padding after the last). A sentence ends where the two add up to
more than 0, which the class-2 column holds.

The ONNX file is protobuf, written here field by field (the onnx package is not needed): IR
version 8, operator set 13, which ONNX Runtime has read since 1.10.
"""

from __future__ import annotations

import json

import numpy as np

PAD, UNK, SPACE = "<PAD>", "<UNK>", " "
# Characters that end a sentence on their own: CJK text puts no space after them.
ENDS_ALONE = tuple("。！？｡")
# Characters that end one when a space (or the end of the paragraph) follows.
ENDS_BEFORE_SPACE = tuple(".!?…")
UNITS = [PAD, UNK, SPACE, *ENDS_ALONE, *ENDS_BEFORE_SPACE]  # MiniSBD's own ids: PAD 0, UNK 1
CLASSES = 3  # inside a token, end of a token, end of a sentence
SENTENCE_END = 2

FLOAT, INT64 = 1, 7  # ONNX TensorProto data types
ATTRIBUTE_INT = 2
IR_VERSION, OPSET = 8, 13


def minisbd_model(lang_code: str) -> bytes:
    """The ONNX model MiniSBD loads from an Argos package's minisbd/ directory."""
    here, after = _tables()
    initializers = [
        _tensor("here", here),
        _tensor("after", after),
        _tensor("zero", np.array([0], dtype=np.int64)),
        _tensor("one", np.array([1], dtype=np.int64)),
        _tensor("end", np.array([np.iinfo(np.int64).max], dtype=np.int64)),
    ]
    nodes = [
        _node("Slice", ["units", "one", "end", "one"], ["rest"]),  # units[:, 1:]
        _node("Slice", ["units", "zero", "one", "one"], ["first"]),  # units[:, :1]
        _node("Sub", ["first", "first"], ["padding"]),  # a column of PAD (id 0)
        _node("Concat", ["rest", "padding"], ["next"], axis=1),  # the id of each character's successor
        _node("Gather", ["here", "units"], ["from_here"]),
        _node("Gather", ["after", "next"], ["from_after"]),
        _node("Add", ["from_here", "from_after"], ["logits"]),
    ]
    graph = b"".join(
        [
            *(_message(1, node) for node in nodes),
            _string(2, "attn sentence ends"),
            *(_message(5, tensor) for tensor in initializers),
            _message(11, _value_info("units", INT64, ["batch", "characters"])),
            _message(11, _value_info("features", FLOAT, ["batch", "characters", "features"])),
            _message(12, _value_info("logits", FLOAT, ["batch", "characters", CLASSES])),
        ]
    )
    config = dict(
        skip_newline=False, max_seqlen=1000, no_ssplit=False, batch_size=32, feat_funcs=[], use_dictionary=False
    )
    vocab = {"lang": lang_code, "idx": 0, "cutoff": 0, "lower": False}
    vocab |= {"_unit2id": {unit: index for index, unit in enumerate(UNITS)}, "_id2unit": UNITS}
    metadata = {"lang_code": lang_code, "config": json.dumps(config), "vocab": json.dumps(vocab)}
    return b"".join(
        [
            _varint_field(1, IR_VERSION),
            _string(2, "attn"),
            _message(7, graph),
            _message(8, _string(1, "") + _varint_field(2, OPSET)),
            *(_message(14, _string(1, key) + _string(2, value)) for key, value in metadata.items()),
        ]
    )


def _tables() -> tuple[np.ndarray, np.ndarray]:
    """(here, after): per unit id, its row when it is the character and when it follows it. The
    end-of-token class is never chosen; the end-of-sentence one when here + after > 0."""
    here = np.zeros((len(UNITS), CLASSES), dtype=np.float32)
    after = np.zeros((len(UNITS), CLASSES), dtype=np.float32)
    here[:, 1] = -1e4
    here[:, SENTENCE_END] = -10.0
    for unit in ENDS_ALONE:
        here[UNITS.index(unit), SENTENCE_END] = 1.0
    for unit in ENDS_BEFORE_SPACE:
        here[UNITS.index(unit), SENTENCE_END] = -0.5
    for unit in (SPACE, PAD):
        after[UNITS.index(unit), SENTENCE_END] = 1.0
    return here, after


# Protobuf's wire format: each field a key (number << 3 | wire type) and its value, a varint
# (type 0) or a length and that many bytes (type 2).


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _varint_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _message(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _string(number: int, text: str) -> bytes:
    return _message(number, text.encode("utf-8"))


def _tensor(name: str, array: np.ndarray) -> bytes:
    kind = {np.dtype(np.float32): FLOAT, np.dtype(np.int64): INT64}[array.dtype]
    little_endian = array.astype(array.dtype.newbyteorder("<"))
    return b"".join(
        [
            *(_varint_field(1, size) for size in array.shape),
            _varint_field(2, kind),
            _string(8, name),
            _message(9, little_endian.tobytes()),
        ]
    )


def _node(op_type: str, inputs: list[str], outputs: list[str], **ints: int) -> bytes:
    attributes = [
        _string(1, key) + _varint_field(3, value) + _varint_field(20, ATTRIBUTE_INT) for key, value in ints.items()
    ]
    return b"".join(
        [
            *(_string(1, name) for name in inputs),
            *(_string(2, name) for name in outputs),
            _string(4, op_type),
            *(_message(5, attribute) for attribute in attributes),
        ]
    )


def _value_info(name: str, kind: int, dims: list[str | int]) -> bytes:
    shape = b"".join(_message(1, _varint_field(1, dim) if isinstance(dim, int) else _string(2, dim)) for dim in dims)
    tensor_type = _varint_field(1, kind) + _message(2, shape)
    return _string(1, name) + _message(2, _message(1, tensor_type))
