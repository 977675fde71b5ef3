"""Checks docs/dcp_format.md's "minimal writer" recipe: writes checkpoints in PyTorch's
distributed checkpoint format (torch.distributed.checkpoint, "DCP") WITHOUT dcp.save,
the way a C++ writer would, and loads them with PyTorch's own dcp.load (issue 49).
Not part of the test suite: run it by hand on PyTorch 2.x (written against 2.11.0):

  python dcp_minimal_writer.py [--items pickle_save|torch.save] [DIR]

  --items pickle_save (default): each .distcp item is what LibTorch's torch::pickle_save
          writes (called here through its Python binding torch._C._pickle_save);
          torch.save: each item is torch.save's zip (what dcp.save itself writes)

The .metadata file is emitted opcode by opcode (class Pickle below: protocol 2, GLOBAL,
NEWOBJ, BUILD, REDUCE, no memo), not with pickle.dump of PyTorch's classes, so that it
is exactly what a C++ writer has to produce byte for byte. Two checkpoints:

  DIR/world1  {"model": {"weight": [4, 3], "bias": [4], "table": [2, 5] (bfloat16)},
               "step": 5}: one file __0_0.distcp, one chunk per tensor
  DIR/world2  the same, as two writers ("ranks") would write it: model.weight in two
               row chunks, rows [0, 3) in __0_0.distcp and [3, 4) in __1_0.distcp

Each is loaded with dcp.load into zero tensors and compared, loaded again with
torch.distributed.checkpoint.format_utils.dcp_to_torch_save (which rebuilds the state
dict from the metadata alone: planner_data, dtypes and sizes), and its .metadata is
compared with the one dcp.save writes for the same state dict. Prints "ok" at the end.
"""
import io
import os
import pickle
import struct
import sys
import tempfile
import uuid
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

MD = "torch.distributed.checkpoint.metadata"
FS = "torch.distributed.checkpoint.filesystem"


class Obj:
    """An object pickled as GLOBAL module name, EMPTY_TUPLE, NEWOBJ, <state>, BUILD:
    cls.__new__(cls), then BUILD sets `state` (a dict: into __dict__; a tuple: through
    the class's __setstate__; None: no state and no BUILD)."""

    def __init__(self, module, name, state):
        self.module, self.name, self.state = module, name, state


class Call:
    """A call pickled as GLOBAL module name, <args tuple>, REDUCE: module.name(*args)."""

    def __init__(self, module, name, args):
        self.module, self.name, self.args = module, name, args


class Global:
    """A module attribute pickled as GLOBAL module name (e.g. torch.float32)."""

    def __init__(self, module, name):
        self.module, self.name = module, name


class Pickle:
    """The protocol-2 pickle opcodes a C++ writer emits (pickletools' names)."""

    def __init__(self):
        self.out = bytearray(b"\x80\x02")  # PROTO 2

    def dump(self, value):
        self.value(value)
        self.out += b"."  # STOP
        return bytes(self.out)

    def value(self, v):
        o = self.out
        if v is None:
            o += b"N"  # NONE
        elif v is True or v is False:
            o += b"\x88" if v else b"\x89"  # NEWTRUE / NEWFALSE
        elif isinstance(v, int):
            if 0 <= v < 1 << 8:
                o += b"K" + struct.pack("<B", v)  # BININT1
            elif 0 <= v < 1 << 16:
                o += b"M" + struct.pack("<H", v)  # BININT2
            elif -(1 << 31) <= v < 1 << 31:
                o += b"J" + struct.pack("<i", v)  # BININT
            else:
                o += b"\x8a\x08" + struct.pack("<q", v)  # LONG1, 8 bytes
        elif isinstance(v, float):
            o += b"G" + struct.pack(">d", v)  # BINFLOAT: big-endian
        elif isinstance(v, str):
            e = v.encode("utf-8")
            o += b"X" + struct.pack("<I", len(e)) + e  # BINUNICODE
        elif isinstance(v, tuple):
            if not v:
                o += b")"  # EMPTY_TUPLE
            else:
                o += b"("  # MARK
                for x in v:
                    self.value(x)
                o += b"t"  # TUPLE
        elif isinstance(v, list):
            o += b"]"  # EMPTY_LIST
            if v:
                o += b"("
                for x in v:
                    self.value(x)
                o += b"e"  # APPENDS
        elif isinstance(v, dict):
            o += b"}"  # EMPTY_DICT
            if v:
                o += b"("
                for k, x in v.items():
                    self.value(k)
                    self.value(x)
                o += b"u"  # SETITEMS
        elif isinstance(v, Global):
            o += f"c{v.module}\n{v.name}\n".encode()  # GLOBAL
        elif isinstance(v, Call):
            self.value(Global(v.module, v.name))
            self.value(tuple(v.args))
            o += b"R"  # REDUCE
        elif isinstance(v, Obj):
            self.value(Global(v.module, v.name))
            o += b")\x81"  # EMPTY_TUPLE, NEWOBJ
            if v.state is not None:
                self.value(v.state)
                o += b"b"  # BUILD
        else:
            raise TypeError(type(v))


def size(dims):
    """torch.Size(dims): GLOBAL 'torch Size', ((d0, d1, ...),), REDUCE."""
    return Call("torch", "Size", (tuple(dims),))


DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
               torch.float64: "float64", torch.int64: "int64", torch.int32: "int32"}


def tensor_storage_metadata(dtype, dims, chunks):
    """TensorStorageMetadata(properties=TensorProperties(dtype, ...), size, chunks):
    TensorProperties's state is the 5-tuple of its __getstate__ (dtype, layout,
    requires_grad, memory-format code, pin_memory)."""
    properties = Obj(MD, "TensorProperties", (
        Global("torch", DTYPE_NAMES[dtype]),
        Global("torch", "strided"),
        False,
        Call(MD, "_MEM_FORMAT_ENCODING", (0,)),  # TORCH_CONTIGUOUS_FORMAT
        False,
    ))
    return Obj(MD, "TensorStorageMetadata", {
        "properties": properties,
        "size": size(dims),
        "chunks": [Obj(MD, "ChunkStorageMetadata", {"offsets": size(off), "sizes": size(sz)})
                   for off, sz in chunks],
    })


def item_bytes(value, how):
    """One .distcp item: a whole torch.save-format zip archive of `value`."""
    if how == "pickle_save":
        return torch._C._pickle_save(value)  # = LibTorch's torch::pickle_save(IValue)
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def write(path, tensors, values, how):
    """tensors: {fqn: (path tuple, tensor, [(file, offsets, sizes), ...])};
    values: {fqn: (path tuple, python value, file)}. Writes the .distcp files and .metadata."""
    os.makedirs(path, exist_ok=True)
    files, storage_data, sd_metadata, planner_data = {}, {}, {}, {}

    def append(file, blob):
        data = files.setdefault(file, bytearray())
        offset = len(data)
        data += blob
        return Obj(FS, "_StorageInfo", {"relative_path": file, "offset": offset, "length": len(blob)})

    for fqn, (obj_path, value, file) in values.items():  # non-tensors first, as dcp.save
        sd_metadata[fqn] = Obj(MD, "BytesStorageMetadata", None)
        planner_data[fqn] = obj_path
        key = Obj(MD, "MetadataIndex", {"fqn": fqn, "offset": None, "index": None})
        storage_data[key] = append(file, item_bytes(value, how))
    for fqn, (obj_path, t, chunks) in tensors.items():
        sd_metadata[fqn] = tensor_storage_metadata(t.dtype, t.shape, [(o, s) for _, o, s in chunks])
        planner_data[fqn] = obj_path
        for i, (file, offsets, sizes) in enumerate(chunks):
            chunk = t[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].clone()  # contiguous, own storage
            key = Obj(MD, "MetadataIndex", {"fqn": fqn, "offset": size(offsets), "index": i})
            storage_data[key] = append(file, item_bytes(chunk, how))
    for file, data in files.items():
        with open(os.path.join(path, file), "wb") as f:
            f.write(data)
    metadata = Obj(MD, "Metadata", {
        "state_dict_metadata": sd_metadata,
        "planner_data": planner_data,
        "storage_data": storage_data,
        "storage_meta": Obj(MD, "StorageMeta", {"checkpoint_id": path, "save_id": str(uuid.uuid4()),
                                                "load_id": None, "modules": []}),
        "version": "1.0.0",
    })
    with open(os.path.join(path, ".metadata"), "wb") as f:
        f.write(Pickle().dump(metadata))


def check(path, tensors, values, reference_dir):
    # 1. dcp.load into a state dict of the same structure.
    target = {"model": {k.split(".")[1]: torch.zeros_like(t) for k, (_, t, _) in tensors.items()}, "step": 0}
    dcp.load(target, checkpoint_id=path)
    for fqn, (_, t, _) in tensors.items():
        assert torch.equal(target["model"][fqn.split(".")[1]], t), fqn
    assert target["step"] == values["step"][1], target["step"]
    # 2. The state dict rebuilt from the metadata alone (planner_data, dtypes, sizes).
    out = os.path.join(path + "-torch-save.pt")
    dcp_to_torch_save(path, out)
    whole = torch.load(out, weights_only=False)
    assert whole["step"] == values["step"][1]
    for fqn, (_, t, _) in tensors.items():
        got = whole["model"][fqn.split(".")[1]]
        assert got.dtype == t.dtype and torch.equal(got, t), fqn
    # 3. The metadata equals dcp.save's for the same state dict, but where the bytes lie.
    ours = pickle.load(open(os.path.join(path, ".metadata"), "rb"))
    state = {"model": {k.split(".")[1]: t for k, (_, t, _) in tensors.items()}, "step": values["step"][1]}
    dcp.save(state, checkpoint_id=reference_dir)
    theirs = pickle.load(open(os.path.join(reference_dir, ".metadata"), "rb"))
    assert ours.planner_data == theirs.planner_data, (ours.planner_data, theirs.planner_data)
    for fqn, md in theirs.state_dict_metadata.items():
        if len(getattr(md, "chunks", [])) == len(getattr(ours.state_dict_metadata[fqn], "chunks", [])):
            assert ours.state_dict_metadata[fqn] == md, (fqn, ours.state_dict_metadata[fqn], md)
        else:  # the split tensor: same properties and size
            assert ours.state_dict_metadata[fqn].properties == md.properties
            assert ours.state_dict_metadata[fqn].size == md.size
    assert ours.version == theirs.version
    print(f"dcp_minimal_writer: {path}: dcp.load and dcp_to_torch_save read it back; metadata as dcp.save's",
          flush=True)


def main():
    args = sys.argv[1:]
    how = "pickle_save"
    if args[:1] == ["--items"]:
        how, args = args[1], args[2:]
    assert how in ("pickle_save", "torch.save"), how
    root = args[0] if args else tempfile.mkdtemp(prefix="dcp_minimal_")
    warnings.simplefilter("ignore")  # dcp.load/save without a process group say so
    torch.manual_seed(0)
    weight, bias, table = torch.randn(4, 3), torch.randn(4), torch.randn(2, 5).to(torch.bfloat16)
    values = {"step": (("step",), 5, "__0_0.distcp")}
    one = {
        "model.weight": (("model", "weight"), weight, [("__0_0.distcp", (0, 0), (4, 3))]),
        "model.bias": (("model", "bias"), bias, [("__0_0.distcp", (0,), (4,))]),
        "model.table": (("model", "table"), table, [("__0_0.distcp", (0, 0), (2, 5))]),
    }
    two = dict(one)
    two["model.weight"] = (("model", "weight"), weight,
                           [("__0_0.distcp", (0, 0), (3, 3)), ("__1_0.distcp", (3, 0), (1, 3))])
    for name, tensors in (("world1", one), ("world2", two)):
        path = os.path.join(root, name)
        write(path, tensors, values, how)
        check(path, tensors, values, os.path.join(root, name + "-dcp-save"))
    print("ok")


if __name__ == "__main__":
    main()
