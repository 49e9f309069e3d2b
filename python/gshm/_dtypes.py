# SPDX-License-Identifier: Apache-2.0
"""Element types understood by Segment.view(), with their NumPy typestr, DLPack
code and safetensors name."""

import collections

__all__ = ["DType", "dtype", "DTYPES"]

DType = collections.namedtuple(
    "DType", "name itemsize typestr dl_code dl_bits safetensors")
DType.__doc__ = """One element type.

name         canonical name ("float32", "bfloat16", ...), as torch spells it
itemsize     bytes per element
typestr      NumPy array-interface typestr ("<f4"), or None where NumPy has none
dl_code      DLPack DLDataTypeCode
dl_bits      DLPack bits
safetensors  safetensors dtype name ("F32"), or None"""

# DLPack type codes (dlpack.h, DLDataTypeCode)
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex, kDLBool = 0, 1, 2, 4, 5, 6
kDLFloat8_e4m3fn, kDLFloat8_e5m2 = 10, 12

DTYPES = collections.OrderedDict((d.name, d) for d in [
    DType("bool", 1, "|b1", kDLBool, 8, "BOOL"),
    DType("int8", 1, "|i1", kDLInt, 8, "I8"),
    DType("uint8", 1, "|u1", kDLUInt, 8, "U8"),
    DType("int16", 2, "<i2", kDLInt, 16, "I16"),
    DType("uint16", 2, "<u2", kDLUInt, 16, "U16"),
    DType("int32", 4, "<i4", kDLInt, 32, "I32"),
    DType("uint32", 4, "<u4", kDLUInt, 32, "U32"),
    DType("int64", 8, "<i8", kDLInt, 64, "I64"),
    DType("uint64", 8, "<u8", kDLUInt, 64, "U64"),
    DType("float16", 2, "<f2", kDLFloat, 16, "F16"),
    DType("bfloat16", 2, None, kDLBfloat, 16, "BF16"),
    DType("float32", 4, "<f4", kDLFloat, 32, "F32"),
    DType("float64", 8, "<f8", kDLFloat, 64, "F64"),
    DType("complex64", 8, "<c8", kDLComplex, 64, "C64"),
    DType("complex128", 16, "<c16", kDLComplex, 128, None),
    DType("float8_e4m3fn", 1, None, kDLFloat8_e4m3fn, 8, "F8_E4M3"),
    DType("float8_e5m2", 1, None, kDLFloat8_e5m2, 8, "F8_E5M2"),
])

_ALIASES = {
    "half": "float16", "float": "float32", "double": "float64",
    "short": "int16", "int": "int32", "long": "int64",
    "cfloat": "complex64", "cdouble": "complex128", "bf16": "bfloat16",
    "bool_": "bool", "?": "bool",
}
for _d in DTYPES.values():
    if _d.typestr:
        _ALIASES[_d.typestr] = _d.name
        _ALIASES[_d.typestr[1:]] = _d.name  # "f4", "u1", "c16"
        if _d.typestr[0] == "<":
            _ALIASES["=" + _d.typestr[1:]] = _d.name
        else:
            _ALIASES["<" + _d.typestr[1:]] = _d.name
            _ALIASES["=" + _d.typestr[1:]] = _d.name
    if _d.safetensors:
        _ALIASES[_d.safetensors] = _d.name  # upper case: "I8" is int8, "i8" int64
del _d


def dtype(spec):
    """The DType for spec: a DType, a name ("float32", "bf16", "F32", "<f4"), a
    NumPy dtype or scalar type, or a torch.dtype.  Raises ValueError for
    unknown or big-endian types."""
    if isinstance(spec, DType):
        return spec
    text = None
    if isinstance(spec, str):
        text = spec
    elif type(spec).__module__ == "torch" and type(spec).__name__ == "dtype":
        text = str(spec)  # "torch.float32"
    else:
        try:
            import numpy
            text = numpy.dtype(spec).str
            if text == "|V2" and getattr(spec, "__name__", "") == "bfloat16":
                text = "bfloat16"
        except Exception:
            raise ValueError("gshm: not a dtype: %r" % (spec,)) from None
    key = text.strip()
    if key.startswith("torch."):
        key = key[len("torch."):]
    name = key if key in DTYPES else _ALIASES.get(key)
    if name is None:
        low = key.lower()
        name = low if low in DTYPES else None
        if name is None and len(low) > 3:
            name = _ALIASES.get(low)
    if name is None:
        if key[:1] == ">":
            raise ValueError("gshm: big-endian dtype %r is not supported" % (spec,))
        raise ValueError("gshm: unsupported dtype %r" % (spec,))
    return DTYPES[name]
