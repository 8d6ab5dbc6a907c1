"""Write the seed corpora (fuzz/corpus/TARGET/seed-*): one small valid input per target and a few
near-misses, made with edgerun's own writers so they follow the formats as written today.
`python -m fuzz.make_corpus` rewrites them; the fuzzers' own finds are added beside them."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from fuzz.targets import CORPUS


def _write(target: str, name: str, data: bytes) -> None:
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"seed-{name}").write_bytes(data)


def main() -> None:
    from onnx import TensorProto, helper, numpy_helper

    from edgerun.fleet.package import pack_task
    from edgerun.frontends.onnx import from_onnx
    from edgerun.remote.wire import encode
    from edgerun.stream.storage import StoredRecord
    from edgerun.stream.uploader import encode_batch

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
                              "g", [x], [y], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    _write("onnx_model", "add-relu", model)

    program = from_onnx(model)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.erp"
        program.save(path)
        _write("program_file", "add-relu", path.read_bytes())

        src = Path(tmp) / "task"
        src.mkdir()
        (src / "task.json").write_text(json.dumps({"name": "seed", "version": 1, "entry": "main.py"}))
        (src / "main.py").write_text("def run(inputs):\n    return inputs\n")
        pack_task(src, Path(tmp) / "t.tar")
        _write("task_package", "hello", (Path(tmp) / "t.tar").read_bytes())

        import gguf

        writer = gguf.GGUFWriter(str(Path(tmp) / "m.gguf"), "llama")
        writer.add_uint32("llama.block_count", 1)
        writer.add_string("general.name", "seed")
        writer.add_tensor("w", np.arange(8, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        _write("gguf", "tiny", (Path(tmp) / "m.gguf").read_bytes())

        # every kind of field (arrays of strings and numbers) and each packed tensor type the reader unpacks
        writer = gguf.GGUFWriter(str(Path(tmp) / "q.gguf"), "llama")
        writer.add_array("tokenizer.ggml.tokens", ["a", "b"])
        writer.add_array("tokenizer.ggml.scores", [0.5, -1.0])
        writer.add_bool("general.flag", True)
        kinds = gguf.GGMLQuantizationType
        writer.add_tensor("h", np.arange(4, dtype=np.float16))
        for name, kind, nbytes in (("q4_0", kinds.Q4_0, 18), ("q8_0", kinds.Q8_0, 34), ("q4_k", kinds.Q4_K, 144),
                                   ("q6_k", kinds.Q6_K, 210)):
            block = np.arange(nbytes, dtype=np.uint8).reshape(1, nbytes)
            writer.add_tensor(name, block, raw_shape=(1, nbytes), raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        _write("gguf", "quantized", (Path(tmp) / "q.gguf").read_bytes())

    frames = encode({"id": 1, "method": "put", "args": {"session": "s"}}, [np.arange(4, dtype=np.float32)])
    _write("remote_wire", "put", b"\0\0".join(bytes(f) for f in frames))
    _write("remote_wire", "hello", bytes(encode({"id": 1, "method": "hello", "args": {}}, [])[0]))

    record = StoredRecord(seq=1, record_id="r1", task_id="t", created_ms=1, payload={"score": 0.5, "ids": [1, 2]})
    batch = encode_batch("dev", [record])
    _write("stream_batch", "zstd", b"\1" + batch)
    _write("stream_batch", "plain", b"\0" + json.dumps({"device_id": "dev", "records": [record.to_wire()]}).encode())


if __name__ == "__main__":
    main()
