"""The number formats a quantized KV cache stores keys and values in: read by the records, the memory formulas
and the quantized layer cache alike."""

KV_DTYPES = {  # the number types a quantized KV cache stores keys and values in: bits a number, largest value
    "int8": (8, 127.0),
    "int4": (4, 7.0),
    "fp8": (8, 448.0),  # float8 e4m3
}
