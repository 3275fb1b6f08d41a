"""cpprun's safetensors header parser against Hugging Face's own reader (Python's safetensors, whose
Rust core reads the header with serde_json) on files safetensors.torch.save_file wrote with odd
tensor names, the same headers rewritten (every non-ASCII character as a \\uXXXX escape, astral ones
as surrogate pairs; keys in reverse order with __metadata__ last; white space), and headers both
must refuse. Usage: safetensors_header_interop.py DUMP_TOOL DIR. Prints FAIL: lines on a mismatch."""
import json
import os
import struct
import subprocess
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

tool, scratch = sys.argv[1], sys.argv[2]

NAMES = ["plain.weight", "caf\u00e9", "\u65e5\u672c\u8a9e", "emoji\U0001F600x", "\U00010348", 'quote"d',
         "back\\slash", "tab\there", "new\nline", "nul\x00byte", "ctl\x01\x1f", "slash/ok", "", " spaced ",
         "__metadata__x", "del\x7f", "n" * 300, "\u2028sep", "\ufeffbom"]
DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool, torch.float16, torch.float64,
          torch.int8, torch.float8_e4m3fn, torch.complex64]
METADATA = {"format": "pt", "\u00fcn\u00efcode": 'va"l\\ue\n', "\U0001F600": ""}


def tensors():
    out = {}
    for i, name in enumerate(NAMES):
        shape = [(), (0, 3), (2, 3), (5,)][i % 4]
        dtype = DTYPES[i % len(DTYPES)]
        out[name] = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape).to(dtype)
    return out


def frame(header_bytes, data):
    header_bytes += b" " * (-len(header_bytes) % 8)
    return struct.pack("<Q", len(header_bytes)) + header_bytes + data


def split(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8:8 + n], raw[8 + n:]


def python_reading(path):
    """What Hugging Face's reader makes of PATH: (tensors by name, metadata), or None when it refuses."""
    try:
        with safe_open(path, "pt") as f:
            header = json.loads(split(path)[0])  # for the offsets, which safe_open does not expose
            found = {}
            for name in f.keys():
                s = f.get_slice(name)
                found[name] = (s.get_dtype(), list(s.get_shape()), header[name]["data_offsets"])
            return found, f.metadata() or {}
    except Exception:  # noqa: BLE001 - any refusal
        return None


def cpprun_readings(paths):
    out = subprocess.run([tool, *paths], check=True, capture_output=True).stdout.decode("utf-8")
    lines = [json.loads(line) for line in out.split("\n") if line]  # not splitlines(): U+2028 is in a name
    assert len(lines) == len(paths), out
    return lines


failures = 0


def fail(message):
    global failures
    failures += 1
    print("FAIL: " + message)


cases = []  # (path, must both read it)
base = os.path.join(scratch, "saved.safetensors")
save_file(tensors(), base, metadata=METADATA)
cases.append((base, True))
header, data = split(base)
parsed = json.loads(header)
variants = {
    "ascii_escapes": json.dumps(parsed, ensure_ascii=True).encode(),
    "reversed_meta_last": json.dumps(
        dict([kv for kv in reversed(list(parsed.items())) if kv[0] != "__metadata__"] +
             [("__metadata__", parsed["__metadata__"])]), ensure_ascii=False).encode("utf-8"),
    "spaced": json.dumps(parsed, ensure_ascii=True, indent=3).replace("\n", "\r\n\t").encode(),
    "upper_hex": json.dumps(parsed, ensure_ascii=True).replace("\\ud83d\\ude00", "\\uD83D\\uDE00").encode(),
    "escaped_slash": json.dumps(parsed, ensure_ascii=False).replace("slash/ok", "slash\\/ok").encode("utf-8"),
}
for tag, text in variants.items():
    path = os.path.join(scratch, tag + ".safetensors")
    open(path, "wb").write(frame(text, data))
    cases.append((path, True))
entry = '{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'
refused = {
    "lone_high": '{"\\ud83d":%s}' % entry,
    "lone_low": '{"\\ude00":%s}' % entry,
    "high_then_not_low": '{"\\ud83d\\u0041":%s}' % entry,
    "raw_control": '{"a\tb":%s}' % entry,
    "bad_escape": '{"a\\qb":%s}' % entry,
    "trailing": '{"a":%s} x' % entry,
    "metadata_number": '{"__metadata__":{"k":1},"a":%s}' % entry,
    "shape_float": '{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}',
    "offset_negative_zero": '{"a":{"dtype":"U8","shape":[1],"data_offsets":[-0,1]}}',
    "repeated_field": '{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}',
    "size_mismatch": '{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,1]}}',
    "unknown_dtype": '{"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}',
}
for tag, text in refused.items():
    path = os.path.join(scratch, tag + ".safetensors")
    open(path, "wb").write(frame(text.encode("utf-8"), b"x"))
    cases.append((path, False))

readings = cpprun_readings([path for path, _ in cases])
for (path, readable), ours in zip(cases, readings):
    theirs = python_reading(path)
    tag = os.path.basename(path)
    if not readable:
        if theirs is not None:
            fail(f"{tag}: Python's safetensors reads it; this test expected a refusal")
        if "error" not in ours:
            fail(f"{tag}: Python's safetensors refuses it but cpprun reads it")
        else:
            print(f"ok {tag}: both refuse; cpprun: {ours['error']}")
        continue
    if theirs is None:
        fail(f"{tag}: Python's safetensors refuses it")
        continue
    if "error" in ours:
        fail(f"{tag}: cpprun refuses it: {ours['error']}")
        continue
    mine = {name: (dtype, shape, [begin, end]) for name, dtype, shape, begin, end in ours["tensors"]}
    if mine != theirs[0]:
        fail(f"{tag}: tensors differ:\n  cpprun {sorted(mine.items())!r}\n  python {sorted(theirs[0].items())!r}")
    elif len(ours["tensors"]) != len(NAMES):
        fail(f"{tag}: {len(ours['tensors'])} tensors, {len(NAMES)} saved")
    elif ours["metadata"] != theirs[1]:
        fail(f"{tag}: metadata differs: cpprun {ours['metadata']!r}, python {theirs[1]!r}")
    else:
        print(f"ok {tag}: {len(mine)} tensors and the metadata read alike")
sys.exit(1 if failures else 0)
