"""A Protobuf schema as `.proto` text -> the serialized FileDescriptorProto the decoders take. Apicurio
Registry's Confluent-compatible API gives Protobuf schemas as text whatever `?format=serialized` says, and
the protobuf package parses no `.proto`: protoc (grpcio-tools' bundled one, Apache-2.0) compiles it, in a
child process so that its errors come back as text. Imports of Google's well-known types resolve from
grpcio-tools' own copies of them."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

TIMEOUT_S = 60.0


class Compiled(NamedTuple):
    """The file's serialized FileDescriptorProto, or (data None) protoc's reason on one line."""

    data: bytes | None
    error: str | None = None


def compile_proto(text: str, name: str = "schema.proto") -> Compiled:
    import grpc_tools
    from google.protobuf import descriptor_pb2

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(prefix="deltadrain-proto-") as tmp:
        (Path(tmp) / name).write_text(text)
        out = Path(tmp) / "out.desc"
        done = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp}", f"-I{well_known}",
                               f"--descriptor_set_out={out}", name], cwd=tmp, capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        if done.returncode != 0 or not out.exists():
            said = " ".join((done.stderr or done.stdout or f"exit {done.returncode}").replace(tmp + "/", "").split())
            return Compiled(None, said[:300])
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return Compiled(files[0].SerializeToString())
