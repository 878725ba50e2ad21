#!/usr/bin/env python3
"""Writes the seed corpus of fuzz/hf_folder_fuzz.cpp into fuzz/corpus/hf_folder/: a valid
Hugging Face GPT-2 folder of the target's small model (1 layer, 2 heads, width 8, 4 positions,
16 tokens) in the target's input format (config.json, a line "@@model.safetensors", the
weights), and the hostile folders the reader must refuse: zero, negative and enormous sizes,
heads that do not divide the width, a header length past the file, offsets that overlap or run
past the data, a dtype whose size does not match the bytes, a dtype that is no float, a shape
that disagrees with the config, an empty config.json.

usage: make_hf_folder_seeds.py OUT_DIR
"""
import json
import os
import struct
import sys

D, LAYERS, HEADS, POSITIONS, VOCAB = 8, 1, 2, 4, 16


def config(**changes):
    c = {"model_type": "gpt2", "vocab_size": VOCAB, "n_positions": POSITIONS, "n_embd": D,
         "n_layer": LAYERS, "n_head": HEADS}
    c.update(changes)
    return json.dumps(c).encode()


def tensors():
    """name -> (dtype, shape), in Hugging Face's names and Conv1D layouts."""
    t = {"transformer.wte.weight": [VOCAB, D], "transformer.wpe.weight": [POSITIONS, D],
         "transformer.ln_f.weight": [D], "transformer.ln_f.bias": [D]}
    for part, shape in (("ln_1.weight", [D]), ("ln_1.bias", [D]),
                        ("attn.c_attn.weight", [D, 3 * D]), ("attn.c_attn.bias", [3 * D]),
                        ("attn.c_proj.weight", [D, D]), ("attn.c_proj.bias", [D]),
                        ("ln_2.weight", [D]), ("ln_2.bias", [D]),
                        ("mlp.c_fc.weight", [D, 4 * D]), ("mlp.c_fc.bias", [4 * D]),
                        ("mlp.c_proj.weight", [4 * D, D]), ("mlp.c_proj.bias", [D])):
        t["transformer.h.0." + part] = shape
    return {name: ("F32", shape) for name, shape in t.items()}


def safetensors(entries, header_edit=None, length=None):
    """entries: name -> (dtype, shape); F32 values 0.01 * i. header_edit(header) may lie."""
    header, blob = {}, b""
    for name, (dtype, shape) in entries.items():
        n = 1
        for d in shape:
            n *= d
        data = struct.pack("<%df" % n, *[0.01 * i for i in range(n)])
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    if header_edit:
        header_edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + blob


def pack(config_json, weights):
    return config_json + b"\n@@model.safetensors\n" + weights


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    good = tensors()

    def edit(name, **fields):
        return lambda header: header[name].update(fields)

    seeds = {
        "valid": pack(config(), safetensors(good)),
        "config_empty": pack(b"", safetensors(good)),
        "layers_zero": pack(config(n_layer=0), safetensors(good)),
        "width_negative": pack(config(n_embd=-8), safetensors(good)),
        "width_enormous": pack(config(n_embd=10 ** 30), safetensors(good)),
        "positions_enormous": pack(config(n_positions=2 ** 62), safetensors(good)),
        "heads_not_dividing": pack(config(n_head=3), safetensors(good)),
        "header_length_past_end": pack(config(), safetensors(good, length=1 << 40)),
        "offsets_overlap": pack(config(), safetensors(
            good, edit("transformer.wpe.weight", data_offsets=[0, 128]))),
        "offsets_past_data": pack(config(), safetensors(
            good, edit("transformer.ln_f.bias", data_offsets=[10 ** 15, 10 ** 15 + 32]))),
        "dtype_size_mismatch": pack(config(), safetensors(
            good, edit("transformer.wte.weight", dtype="F16"))),
        "dtype_not_float": pack(config(), safetensors(
            good, edit("transformer.wte.weight", dtype="I32"))),
        "shape_disagrees": pack(config(), safetensors(
            good, edit("transformer.wpe.weight", shape=[8, 4]))),
        "shape_bytes_wrap": pack(config(), safetensors(
            good, edit("transformer.ln_f.bias", dtype="F64", shape=[2 ** 62],
                       data_offsets=[0, 0]))),
    }
    for name, data in seeds.items():
        with open(os.path.join(out, name + ".hf"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
