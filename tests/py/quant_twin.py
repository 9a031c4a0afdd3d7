#!/usr/bin/env python3
"""Writes the BF16 twin of a quantized MiniMax-M3 checkpoint, independently of m3mono's code.

    quant_twin.py SRC_DIR DST_DIR

SRC_DIR holds config.json and model.safetensors (or shards with model.safetensors.index.json) in
one of the released quantized layouts; DST_DIR gets config.json without its quantization_config
and one model.safetensors in which every quantized weight is replaced by its dequantized values in
BF16 (F32 where BF16 cannot hold them: FP8 times an fp32 tensor scale), every scale companion (and static input_scale) is dropped, and every other tensor is copied
byte for byte. An MX value that fp32 cannot hold exactly is an error (the twin would not be a twin). Formats are recognized by the tensors beside a weight, not by the config:
    F8_E4M3 weight + U8 weight_scale_inv (or U8 weight_scale)  -> MXFP8: e4m3 * 2^(s - 127) per 32
    U8 weight + U8 weight_scale (or scale)                    -> MXFP4: e2m1 * 2^(s - 127) per 32,
                                                                 element 2j in the low nibble
    F8_E4M3 weight + F32 weight_scale of one element          -> FP8 per tensor: e4m3 * scale
Decoding follows the OCP MX v1.0 and OFP8 definitions, written here from the specification (no
NumPy: plain Python, which is fast enough for the tiny checkpoints the tests use).
"""
import json
import os
import struct
import sys
from array import array


def e4m3(code):
    s = -1.0 if code & 0x80 else 1.0
    e = (code >> 3) & 0xF
    m = code & 0x7
    if e == 0xF and m == 0x7:
        raise ValueError("E4M3 NaN code")
    if e == 0:
        return s * (m / 8.0) * 2.0 ** -6
    return s * (1.0 + m / 8.0) * 2.0 ** (e - 7)


def e2m1(nib):
    s = -1.0 if nib & 0x8 else 1.0
    e = (nib >> 1) & 0x3
    m = nib & 0x1
    if e == 0:
        return s * 0.5 * m
    return s * (1.0 + 0.5 * m) * 2.0 ** (e - 1)


def e8m0(b, what):
    if b == 255:
        raise ValueError(f"{what}: E8M0 scale 255 (NaN)")
    return 2.0 ** (b - 127)


E4M3 = [None if c in (0x7F, 0xFF) else e4m3(c) for c in range(256)]
E2M1 = [e2m1(n) for n in range(16)]


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[base + lo:base + hi])
    return out


def read_checkpoint(src):
    idx = os.path.join(src, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for fn in files:
        tensors.update(read_safetensors(os.path.join(src, fn)))
    return tensors


def to_twin(values, name, exact):
    """(dtype, bytes): BF16 when every value is exact in it, else F32. The products here are exact in
    double (a 4-bit code times a power of two or an fp32 scale), so array('f') rounds each once to
    nearest even, as one fp32 multiply does. exact: the format's products must be exact in fp32
    (MX: a code times a power of two)."""
    if sys.byteorder != "little":
        raise ValueError("this writer assumes a little-endian host")
    f32 = array("f", values)
    if exact and f32.tolist() != values:
        raise ValueError(f"{name}: a dequantized MX value is not exact in fp32")
    raw = f32.tobytes()
    if raw[0::4].count(0) != len(values) or raw[1::4].count(0) != len(values):
        return "F32", raw
    out = bytearray(2 * len(values))
    out[0::2] = raw[2::4]
    out[1::2] = raw[3::4]
    return "BF16", bytes(out)


def dequantize(name, t, tensors):
    dtype, shape, raw = t
    module = name[: -len(".weight")]

    def companion(*suffixes):
        found = [module + "." + s for s in suffixes if module + "." + s in tensors]
        if len(found) > 1:
            raise ValueError(f"{name}: two scales {found}")
        return found[0] if found else None

    if dtype == "F8_E4M3":
        sn = companion("weight_scale_inv", "weight_scale")
        if sn is None:
            raise ValueError(f"{name}: F8_E4M3 without a scale")
        sdt, sshape, sraw = tensors[sn]
        rows, cols = shape
        if sdt == "F32":
            (scale,) = struct.unpack("<f", sraw)
            vals = [E4M3[c] * scale for c in raw]
            return shape, vals, {sn, module + ".input_scale"}, False
        else:
            blocks = sshape[1]
            vals = []
            for r in range(rows):
                row = raw[r * cols:(r + 1) * cols]
                sc = [e8m0(b, f"{sn} row {r}") for b in sraw[r * blocks:(r + 1) * blocks]]
                vals.extend(E4M3[c] * sc[i // 32] for i, c in enumerate(row))
        return shape, vals, {sn}, True
    if dtype == "U8":
        sn = companion("weight_scale", "scale")
        if sn is None:
            raise ValueError(f"{name}: U8 weight without a scale")
        _, sshape, sraw = tensors[sn]
        rows, half = shape
        blocks = sshape[1]
        vals = []
        for r in range(rows):
            row = raw[r * half:(r + 1) * half]
            sc = [e8m0(b, f"{sn} row {r}") for b in sraw[r * blocks:(r + 1) * blocks]]
            for j, byte in enumerate(row):
                vals.append(E2M1[byte & 0xF] * sc[(2 * j) // 32])
                vals.append(E2M1[byte >> 4] * sc[(2 * j + 1) // 32])
        return [rows, half * 2], vals, {sn}, True
    return None


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    tensors = read_checkpoint(src)
    out, dropped, quantized, as_f32 = {}, set(), 0, 0
    for name, t in tensors.items():
        if not name.endswith(".weight"):
            continue
        d = dequantize(name, t, tensors)
        if d is None:
            continue
        shape, vals, companions, exact = d
        dtype, raw = to_twin(vals, name, exact)
        out[name] = (dtype, shape, raw)
        dropped |= companions
        quantized += 1
        as_f32 += dtype == "F32"
    for name, t in tensors.items():
        if name not in out and name not in dropped:
            out[name] = t
    os.makedirs(dst, exist_ok=True)
    write_safetensors(os.path.join(dst, "model.safetensors"), out)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"].pop("quantization_config", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"quant_twin: {quantized} quantized weights dequantized ({as_f32} of them to F32: per-tensor scales are "
          f"not powers of two), {len(out)} tensors written to {dst}")


if __name__ == "__main__":
    main()
